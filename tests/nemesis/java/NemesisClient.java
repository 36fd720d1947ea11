// The fault campaign's load with the Java client (org.apache.kafka:kafka-clients), on topics of its own: an
// idempotent acks=all producer sending numbered values at a steady rate; a consumer group whose members
// commit synchronously after every poll that returned records; and read-process-write processors, each a
// read_committed member of another group with a transactional producer of its own, writing "<input>|<txn>" to
// the same partition of an output topic and the group's offsets in one transaction (a seeded fifth aborted on
// purpose).  Everything it observes goes to stdout as JSON lines, for tests/nemesis/java_workload.py and the
// campaign's checker:
//
//   {"e":"send","v":value}                         a record handed to the producer
//   {"e":"ack","v":value,"p":partition,"o":offset} its acknowledgement
//   {"e":"error","v":value,"error":"..."}          its failure
//   {"e":"assigned"|"revoked"|"lost","c":member,"partitions":[...]}   a rebalance, as the member's listener saw it
//   {"e":"poll","c":member,"p":..,"o":..,"v":..}   a polled record, in the order poll returned them
//   {"e":"commit","c":member,"p":..,"o":..}        an offset commitSync confirmed
//   {"e":"commit-error"|"consumer-error","c":member,"error":"..."}
//   {"e":"txn","id":..,"producer":..,"outcome":"committed"|"aborted"|"unknown","writes":[[p,v]..],
//    "reads":[[p,o,v]..],"commit_at":seconds|null,"ended":seconds,"offsets":{"p":o}}   one transaction; times
//                                                  are CLOCK_MONOTONIC's (System.nanoTime), as Python's
//   {"e":"txn-error","c":processor,"error":"..."}
//   {"e":"producer-closed","sent":n,"unreported":n}  after "stop-producer <seconds>" on stdin: sending stopped
//                                                    and the acknowledgements waited for, at most that long
//   {"e":"closed"}                                 after "stop" (or the end of stdin, or SIGTERM): every client
//                                                  closed, each within a bounded time
//
// A transaction's outcome is the client's: committed when commitTransaction returned, aborted when
// abortTransaction returned or the commit was never asked for, unknown otherwise (a new producer with the same
// transactional.id then fences the old one and settles it).
//
// Usage: NemesisClient <bootstrap> <topic> <group> <value prefix> <records per second> <members> <max seconds>
//                      <output topic> <processors> <seed>
// Compiled by compat/env.py (compile_java) against the jars compat/java/pom.xml names.

import com.fasterxml.jackson.databind.ObjectMapper;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Random;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.AuthorizationException;
import org.apache.kafka.common.errors.OutOfOrderSequenceException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.errors.TimeoutException;
import org.apache.kafka.common.errors.UnsupportedVersionException;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class NemesisClient {
    static final ObjectMapper JSON = new ObjectMapper();
    static final PrintStream OUT = new PrintStream(System.out, false, StandardCharsets.UTF_8);
    static final long CLOSE_SECONDS = 10;
    static final double ABORT_FRACTION = 0.2;

    final String bootstrap;
    final String topic;
    final String group;
    final String prefix;
    final int rate;
    final long deadlineNanos;
    final AtomicBoolean producing = new AtomicBoolean(true);
    final AtomicBoolean consuming = new AtomicBoolean(true);
    final AtomicBoolean closed = new AtomicBoolean(false);
    final AtomicLong sent = new AtomicLong();
    final AtomicLong pending = new AtomicLong();  // sent, neither acknowledged nor failed yet
    final KafkaProducer<String, String> producer;
    final Thread producerThread;
    final List<Member> members = new ArrayList<>();
    final String output;
    final String processGroup;
    final long seed;
    final List<Processor> processors = new ArrayList<>();

    NemesisClient(String[] args) {
        bootstrap = args[0];
        topic = args[1];
        group = args[2];
        prefix = args[3];
        rate = Integer.parseInt(args[4]);
        int count = Integer.parseInt(args[5]);
        deadlineNanos = System.nanoTime() + TimeUnit.SECONDS.toNanos(Long.parseLong(args[6]));
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.CLIENT_ID_CONFIG, prefix + "producer");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "180000");
        p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        p.put(ProducerConfig.RETRY_BACKOFF_MS_CONFIG, "100");
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "10000");
        p.put(ProducerConfig.METADATA_MAX_AGE_CONFIG, "5000");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        producer = new KafkaProducer<>(p);
        producerThread = new Thread(this::produce, "nemesis-java-producer");
        for (int i = 1; i <= count; i++) {
            members.add(new Member("java-reader-" + i));
        }
        output = args[7];
        processGroup = group + "-rpw";
        seed = Long.parseLong(args[9]);
        for (int i = 1; i <= Integer.parseInt(args[8]); i++) {
            processors.add(new Processor("java-processor-" + i, i));
        }
    }

    static double now() {
        return System.nanoTime() / 1e9;
    }

    static void emit(Map<String, Object> event) {
        String line;
        try {
            line = JSON.writeValueAsString(event);
        } catch (Exception e) {
            line = "{\"e\":\"consumer-error\",\"c\":\"output\",\"error\":\"" + e.getClass().getSimpleName() + "\"}";
        }
        synchronized (OUT) {
            OUT.println(line);
            OUT.flush();
        }
    }

    static Map<String, Object> event(String kind, Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("e", kind);
        for (int i = 0; i + 1 < kv.length; i += 2) {
            m.put((String) kv[i], kv[i + 1]);
        }
        return m;
    }

    static String describe(Throwable e) {
        return e.getClass().getSimpleName() + ": " + e.getMessage();
    }

    /** One value per 1/rate seconds until told to stop or out of time; each outcome reported by its callback. */
    void produce() {
        long interval = TimeUnit.SECONDS.toNanos(1) / Math.max(1, rate);
        long next = System.nanoTime();
        while (producing.get() && System.nanoTime() < deadlineNanos) {
            String value = String.format("%s%08d", prefix, sent.get());
            emit(event("send", "v", value));
            sent.incrementAndGet();
            pending.incrementAndGet();
            try {
                producer.send(new ProducerRecord<>(topic, value, value), (md, err) -> {
                    if (err != null) {
                        emit(event("error", "v", value, "error", describe(err)));
                    } else {
                        emit(event("ack", "v", value, "p", md.partition(), "o", md.offset()));
                    }
                    pending.decrementAndGet();
                });
            } catch (RuntimeException e) {  // not handed to the producer at all: no callback will come
                emit(event("error", "v", value, "error", describe(e)));
                pending.decrementAndGet();
            }
            next += interval;
            long wait = next - System.nanoTime();
            if (wait > 0) {
                LockSupport.parkNanos(wait);
            } else {
                next = System.nanoTime();  // behind after a blocked send: the rate, not a burst to catch up
            }
        }
    }

    /** Stop sending and wait for every outstanding acknowledgement, at most ``seconds``; then close. */
    void stopProducer(long seconds) throws InterruptedException {
        if (!producing.getAndSet(false)) {
            return;
        }
        producerThread.join(TimeUnit.SECONDS.toMillis(CLOSE_SECONDS));
        long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(seconds);
        while (pending.get() > 0 && System.nanoTime() < until) {
            Thread.sleep(50);
        }
        long unreported = pending.get();
        emit(event("producer-closed", "sent", sent.get(), "unreported", unreported));
        producer.close(Duration.ofSeconds(CLOSE_SECONDS));
    }

    /** Stop everything, each client within a bounded time; idempotent (stdin and SIGTERM may both ask). */
    void shutdown(long flushSeconds) {
        if (closed.getAndSet(true)) {
            return;
        }
        try {
            stopProducer(flushSeconds);
            consuming.set(false);
            for (Member m : members) {
                m.consumer.wakeup();
            }
            for (Processor x : processors) {
                x.consumer.wakeup();
            }
            for (Member m : members) {
                m.thread.join(TimeUnit.SECONDS.toMillis(CLOSE_SECONDS + 5));
            }
            for (Processor x : processors) {  // a transaction's calls are bounded by max.block.ms (10 s) each
                x.thread.join(TimeUnit.SECONDS.toMillis(6 * CLOSE_SECONDS));
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        emit(event("closed"));
    }

    /** A member of the group: polls, reports every record and rebalance, commits what it polled. */
    final class Member implements ConsumerRebalanceListener {
        final String name;
        final KafkaConsumer<String, String> consumer;
        final Thread thread;

        Member(String name) {
            this.name = name;
            Properties p = new Properties();
            p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
            p.put(ConsumerConfig.CLIENT_ID_CONFIG, prefix + name);
            p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
            p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
            p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "10000");
            p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "1000");
            p.put(ConsumerConfig.METADATA_MAX_AGE_CONFIG, "5000");
            p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "500");
            p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
            p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
            consumer = new KafkaConsumer<>(p);
            thread = new Thread(this::run, "nemesis-" + name);
        }

        void rebalance(String kind, Collection<TopicPartition> partitions) {
            List<Integer> ps = new ArrayList<>();
            for (TopicPartition tp : partitions) {
                ps.add(tp.partition());
            }
            emit(event(kind, "c", name, "partitions", ps));
        }

        @Override
        public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
            rebalance("revoked", partitions);
        }

        @Override
        public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
            rebalance("assigned", partitions);
        }

        @Override
        public void onPartitionsLost(Collection<TopicPartition> partitions) {
            rebalance("lost", partitions);
        }

        void run() {
            try {
                consumer.subscribe(List.of(topic), this);
                while (consuming.get() && System.nanoTime() < deadlineNanos) {
                    ConsumerRecords<String, String> records;
                    try {
                        records = consumer.poll(Duration.ofMillis(500));
                    } catch (WakeupException e) {
                        break;
                    } catch (RuntimeException e) {
                        emit(event("consumer-error", "c", name, "error", describe(e)));
                        continue;
                    }
                    if (records.isEmpty()) {
                        continue;
                    }
                    Map<TopicPartition, OffsetAndMetadata> next = new HashMap<>();
                    for (ConsumerRecord<String, String> r : records) {
                        emit(event("poll", "c", name, "p", r.partition(), "o", r.offset(), "v", r.value()));
                        next.put(new TopicPartition(r.topic(), r.partition()), new OffsetAndMetadata(r.offset() + 1));
                    }
                    try {
                        consumer.commitSync(next, Duration.ofSeconds(15));
                    } catch (WakeupException e) {
                        break;
                    } catch (RuntimeException e) {  // a rebalance or a moving coordinator: the next commit covers it
                        emit(event("commit-error", "c", name, "error", describe(e)));
                        continue;
                    }
                    for (Map.Entry<TopicPartition, OffsetAndMetadata> c : next.entrySet()) {
                        emit(event("commit", "c", name, "p", c.getKey().partition(), "o", c.getValue().offset()));
                    }
                }
            } catch (RuntimeException e) {
                emit(event("consumer-error", "c", name, "error", describe(e)));
            } finally {
                try {
                    consumer.close(Duration.ofSeconds(CLOSE_SECONDS));
                } catch (RuntimeException e) {
                    emit(event("consumer-error", "c", name, "error", "close: " + describe(e)));
                }
            }
        }
    }

    /** Read-process-write: a read_committed member of the processors' group with a transactional producer. */
    final class Processor implements ConsumerRebalanceListener {
        final String name;
        final String transactionalId;
        final Random rng;
        final KafkaConsumer<String, String> consumer;
        final Thread thread;
        KafkaProducer<String, String> producer;
        boolean rewind;  // the last transaction did not commit: back to the group's committed offsets first
        int count;

        Processor(String name, int index) {
            this.name = name;
            this.transactionalId = processGroup + "-" + name;
            this.rng = new Random(seed * 31 + index);
            Properties p = new Properties();
            p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            p.put(ConsumerConfig.GROUP_ID_CONFIG, processGroup);
            p.put(ConsumerConfig.CLIENT_ID_CONFIG, prefix + name);
            p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
            p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
            p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
            p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "10000");
            p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "1000");
            p.put(ConsumerConfig.METADATA_MAX_AGE_CONFIG, "5000");
            p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "100");
            p.put(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "15000");
            p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
            p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
            consumer = new KafkaConsumer<>(p);
            thread = new Thread(this::run, "nemesis-" + name);
        }

        void error(String what, Throwable e) {
            emit(event("txn-error", "c", name, "error", what + ": " + describe(e)));
        }

        /** A producer that has initialised its transactions (fencing any earlier one), or null. */
        KafkaProducer<String, String> newProducer() {
            Properties p = new Properties();
            p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            p.put(ProducerConfig.CLIENT_ID_CONFIG, prefix + name);
            p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
            p.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "60000");
            p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "55000");
            p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
            p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
            p.put(ProducerConfig.RETRY_BACKOFF_MS_CONFIG, "100");
            p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "10000");
            p.put(ProducerConfig.METADATA_MAX_AGE_CONFIG, "5000");
            p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
            p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
            KafkaProducer<String, String> made = new KafkaProducer<>(p);
            try {
                made.initTransactions();
                return made;
            } catch (RuntimeException e) {
                error("initTransactions", e);
                made.close(Duration.ZERO);
                return null;
            }
        }

        void dropProducer() {
            if (producer != null) {
                producer.close(Duration.ZERO);
                producer = null;
            }
        }

        /** Back to the group's committed offsets (a pending transactional commit settles first: read_committed
         * consumers ask for stable offsets); false when they could not be fetched. */
        boolean rewind() {
            Set<TopicPartition> assigned = consumer.assignment();
            try {
                Map<TopicPartition, OffsetAndMetadata> committed = consumer.committed(assigned);
                for (TopicPartition tp : assigned) {
                    OffsetAndMetadata o = committed.get(tp);
                    if (o != null) {
                        consumer.seek(tp, o.offset());
                    } else {
                        consumer.seekToBeginning(List.of(tp));
                    }
                }
                return true;
            } catch (WakeupException e) {
                throw e;
            } catch (RuntimeException e) {
                error("rewind", e);
                return false;
            }
        }

        @Override
        public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
        }

        @Override
        public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
            rewind = false;  // positions come from the committed offsets anyway
        }

        void run() {
            try {
                consumer.subscribe(List.of(topic), this);
                while (consuming.get() && System.nanoTime() < deadlineNanos) {
                    if (producer == null) {
                        producer = newProducer();
                        if (producer == null) {
                            Thread.sleep(1000);
                            continue;
                        }
                    }
                    if (rewind && !rewind()) {
                        Thread.sleep(500);
                        continue;
                    }
                    rewind = false;
                    ConsumerRecords<String, String> records;
                    try {
                        records = consumer.poll(Duration.ofMillis(500));
                    } catch (WakeupException e) {
                        break;
                    } catch (RuntimeException e) {
                        error("poll", e);
                        continue;
                    }
                    if (!records.isEmpty()) {
                        transact(records);
                    }
                }
            } catch (WakeupException e) {
                // stopping
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            } catch (RuntimeException e) {
                error("processor", e);
            } finally {
                close();
            }
        }

        void transact(ConsumerRecords<String, String> records) {
            String id = name + "-" + (++count);
            List<List<Object>> writes = new ArrayList<>();
            List<List<Object>> reads = new ArrayList<>();
            Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
            Map<String, Long> offsetsOut = new LinkedHashMap<>();
            boolean commit = rng.nextDouble() >= ABORT_FRACTION;
            Double commitAt = null;
            String outcome;
            KafkaProducer<String, String> p = producer;
            try {
                p.beginTransaction();
                for (ConsumerRecord<String, String> r : records) {
                    String value = r.value() + "|" + id;
                    reads.add(List.of(r.partition(), r.offset(), r.value()));
                    writes.add(List.of(r.partition(), value));
                    offsets.put(new TopicPartition(r.topic(), r.partition()), new OffsetAndMetadata(r.offset() + 1));
                    offsetsOut.put(String.valueOf(r.partition()), r.offset() + 1);
                    p.send(new ProducerRecord<>(output, r.partition(), value, value));
                }
                p.sendOffsetsToTransaction(offsets, consumer.groupMetadata());
                if (commit) {
                    commitAt = now();
                    p.commitTransaction();
                    outcome = "committed";
                } else {
                    p.abortTransaction();
                    outcome = "aborted";
                }
            } catch (ProducerFencedException | OutOfOrderSequenceException | AuthorizationException
                     | UnsupportedVersionException | TimeoutException e) {
                // Fatal, or no telling where it stands: a new producer fences this one and settles the transaction.
                error(id, e);
                outcome = commitAt == null ? "aborted" : "unknown";
                dropProducer();
            } catch (KafkaException e) {
                error(id, e);
                if (commitAt != null) {  // the commit was asked for: it may have been written
                    outcome = "unknown";
                    dropProducer();
                } else {
                    outcome = "aborted";
                    try {
                        p.abortTransaction();
                    } catch (RuntimeException e2) {
                        error(id + " abort", e2);
                        dropProducer();
                    }
                }
            } catch (RuntimeException e) {  // a producer in a state it cannot go on from
                error(id, e);
                outcome = commitAt == null ? "aborted" : "unknown";
                dropProducer();
            }
            if (!outcome.equals("committed")) {
                rewind = true;
            }
            emit(event("txn", "id", id, "producer", transactionalId, "outcome", outcome, "writes", writes,
                       "reads", reads, "commit_at", commitAt, "ended", now(), "offsets", offsetsOut));
        }

        void close() {
            try {
                if (producer == null) {  // a transaction left open by a dropped producer: fence and settle it
                    producer = newProducer();
                }
                if (producer != null) {
                    producer.close(Duration.ofSeconds(CLOSE_SECONDS));
                }
            } catch (RuntimeException e) {
                error("close", e);
            }
            try {
                consumer.close(Duration.ofSeconds(CLOSE_SECONDS));
            } catch (RuntimeException e) {
                error("close", e);
            }
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 10) {
            System.err.println("usage: NemesisClient <bootstrap> <topic> <group> <prefix> <rate> <members> <max seconds>"
                               + " <output topic> <processors> <seed>");
            System.exit(2);
        }
        NemesisClient client = new NemesisClient(args);
        Thread hook = new Thread(() -> client.shutdown(CLOSE_SECONDS), "nemesis-java-shutdown");
        Runtime.getRuntime().addShutdownHook(hook);
        client.producerThread.start();
        for (Member m : client.members) {
            m.thread.start();
        }
        for (Processor x : client.processors) {
            x.thread.start();
        }
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            String[] words = line.trim().split("\\s+");
            if (words[0].equals("stop-producer")) {
                client.stopProducer(words.length > 1 ? Long.parseLong(words[1]) : CLOSE_SECONDS);
            } else if (words[0].equals("stop")) {
                break;
            }
        }
        client.shutdown(CLOSE_SECONDS);
        Runtime.getRuntime().removeShutdownHook(hook);
        System.exit(0);
    }
}
