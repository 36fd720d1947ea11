// The Java client (org.apache.kafka:kafka-clients) driven by the compatibility suite.
//
// One long-lived JVM per test worker.  Requests arrive on stdin as JSON lines
// {"id": n, "op": "...", ...}; each runs on its own thread and its answer goes to stdout as
// {"id": n, "ok": true, "result": ...} or {"id": n, "ok": false, "error": {"code", "name", "class", "message"}}.
// Bytes travel base64-encoded; null stays null.  Compiled by compat/env.py at test time.

import com.fasterxml.jackson.databind.ObjectMapper;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collection;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterClientQuotasOptions;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.AlterConfigsOptions;
import org.apache.kafka.clients.admin.DescribeClusterOptions;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.DescribeConfigsOptions;
import org.apache.kafka.clients.admin.DescribeConsumerGroupsOptions;
import org.apache.kafka.clients.admin.LogDirDescription;
import org.apache.kafka.clients.admin.NewPartitionReassignment;
import org.apache.kafka.clients.admin.PartitionReassignment;
import org.apache.kafka.clients.admin.ReplicaInfo;
import org.apache.kafka.common.ElectionType;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.TopicPartitionReplica;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.quota.ClientQuotaAlteration;
import org.apache.kafka.common.quota.ClientQuotaEntity;
import org.apache.kafka.common.quota.ClientQuotaFilter;
import org.apache.kafka.common.quota.ClientQuotaFilterComponent;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.ConsumerGroupListing;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionListing;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DescribeTopicsOptions;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.ListTopicsOptions;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.ApiException;
import org.apache.kafka.common.errors.TimeoutException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.protocol.Errors;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.utils.AppInfoParser;

@SuppressWarnings({"unchecked", "rawtypes"})
public class CompatDriver {
    static final ObjectMapper JSON = new ObjectMapper();
    static final PrintStream OUT = new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), true,
                                                   StandardCharsets.UTF_8);
    static final AtomicInteger SEQ = new AtomicInteger();
    static final Map<String, Member> MEMBERS = new ConcurrentHashMap<>();
    static String bootstrap;
    // Optional second argument: a SASL_PLAINTEXT identity as JSON {mechanism, username, password}.
    static final Map<String, String> SECURITY = new HashMap<>();
    static Admin admin;

    public static void main(String[] args) throws Exception {
        bootstrap = args[0];
        if (args.length > 1) security(JSON.readValue(args[1], Map.class));
        // The clients log through slf4j; with no binding on the classpath that is silent.
        System.setOut(System.err);
        ExecutorService pool = Executors.newCachedThreadPool(r -> {
            Thread t = new Thread(r);
            t.setDaemon(true);
            return t;
        });
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        reply(Map.of("id", 0, "ok", true, "result", Map.of("version", AppInfoParser.getVersion())));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) continue;
            Map<String, Object> req = JSON.readValue(line, Map.class);
            pool.submit(() -> handle(req));
        }
        for (Member m : MEMBERS.values()) m.close();
        if (admin != null) admin.close(Duration.ofSeconds(5));
        System.exit(0);
    }

    static void security(Map<String, Object> sasl) {
        String mech = (String) sasl.get("mechanism");
        String module = mech.equals("PLAIN") ? "org.apache.kafka.common.security.plain.PlainLoginModule"
                                             : "org.apache.kafka.common.security.scram.ScramLoginModule";
        SECURITY.put("security.protocol", "SASL_PLAINTEXT");
        SECURITY.put("sasl.mechanism", mech);
        SECURITY.put("sasl.jaas.config", module + " required username=\"" + jaasEscape((String) sasl.get("username"))
                     + "\" password=\"" + jaasEscape((String) sasl.get("password")) + "\";");
    }

    static String jaasEscape(String s) {
        return s.replace("\\", "\\\\").replace("\"", "\\\"");
    }

    static synchronized void reply(Map<String, Object> msg) {
        try {
            OUT.println(JSON.writeValueAsString(msg));
        } catch (Exception e) {
            e.printStackTrace();
        }
    }

    static void handle(Map<String, Object> req) {
        Object id = req.get("id");
        Map<String, Object> resp = new LinkedHashMap<>();
        resp.put("id", id);
        try {
            resp.put("result", dispatch((String) req.get("op"), req));
            resp.put("ok", true);
        } catch (Throwable t) {
            resp.put("ok", false);
            resp.put("error", describe(t));
        }
        reply(resp);
    }

    static Map<String, Object> describe(Throwable t) {
        Throwable e = t;
        while ((e instanceof ExecutionException || (e.getClass() == KafkaException.class)) && e.getCause() != null) {
            e = e.getCause();
        }
        int code;
        if (e instanceof org.apache.kafka.clients.consumer.OffsetOutOfRangeException) {
            code = Errors.OFFSET_OUT_OF_RANGE.code();
        } else if (e instanceof TimeoutException) {
            code = Errors.REQUEST_TIMED_OUT.code();
        } else if (e instanceof ApiException) {
            code = Errors.forException(e).code();
        } else {
            code = -1;
        }
        Map<String, Object> err = new LinkedHashMap<>();
        err.put("code", code);
        err.put("name", code == -1 ? e.getClass().getSimpleName() : Errors.forCode((short) code).name());
        err.put("class", e.getClass().getName());
        err.put("message", String.valueOf(e.getMessage()));
        return err;
    }

    // ------------------------------------------------------------------------------------------
    static Object dispatch(String op, Map<String, Object> r) throws Exception {
        switch (op) {
            case "ping": return "pong";
            case "create_topic": return createTopic(r);
            case "delete_topic": admin().deleteTopics(List.of(str(r, "name"))).all().get(30, TimeUnit.SECONDS); return null;
            case "create_partitions":
                admin().createPartitions(Map.of(str(r, "name"), NewPartitions.increaseTo(num(r, "total"))))
                        .all().get(30, TimeUnit.SECONDS);
                return null;
            case "describe_topic": return describeTopic(r);
            case "topic_configs": return topicConfigs(r);
            case "delete_records": return deleteRecords(r);
            case "metadata": return metadata();
            case "produce": return produce(r);
            case "produce_transactions": produceTransactions(r); return null;
            case "transactional_offsets": transactionalOffsets(r); return null;
            case "consume": return consume(r);
            case "list_offset": return listOffset(r);
            case "start_member": return startMember(r);
            case "member_state": return MEMBERS.get(str(r, "member")).state();
            case "member_close": {
                Member m = MEMBERS.remove(str(r, "member"));
                if (m != null) m.close();
                return m == null ? null : m.state();
            }
            case "commit_offsets": commitOffsets(r); return null;
            case "committed_offsets": return committedOffsets(r);
            case "list_groups": {
                List<String> out = new ArrayList<>();
                for (ConsumerGroupListing g : admin().listConsumerGroups().all().get(30, TimeUnit.SECONDS)) out.add(g.groupId());
                return out;
            }
            case "describe_group": {
                String g = str(r, "group");
                ConsumerGroupDescription d = admin().describeConsumerGroups(List.of(g)).describedGroups().get(g)
                        .get(30, TimeUnit.SECONDS);
                return Map.of("state", d.state().toString(), "members", d.members().size());
            }
            case "delete_group":
                admin().deleteConsumerGroups(List.of(str(r, "group"))).all().get(30, TimeUnit.SECONDS);
                return null;
            case "delete_committed_offsets": {
                java.util.Set<TopicPartition> tps = new java.util.HashSet<>();
                for (Object p : (List<Object>) r.get("partitions")) tps.add(new TopicPartition(str(r, "topic"), ((Number) p).intValue()));
                admin().deleteConsumerGroupOffsets(str(r, "group"), tps).all().get(30, TimeUnit.SECONDS);
                return null;
            }
            case "list_transactions": {
                Map<String, String> out = new HashMap<>();
                for (TransactionListing t : admin().listTransactions().all().get(30, TimeUnit.SECONDS)) {
                    out.put(t.transactionalId(), t.state().toString());
                }
                return out;
            }
            case "describe_transaction": {
                String tid = str(r, "transactional_id");
                TransactionDescription d = admin().describeTransactions(List.of(tid)).description(tid).get(30, TimeUnit.SECONDS);
                return d.state().toString();
            }
            case "describe_producers": {
                TopicPartition tp = new TopicPartition(str(r, "topic"), num(r, "partition"));
                List<Long> ids = new ArrayList<>();
                for (ProducerState p : admin().describeProducers(List.of(tp)).partitionResult(tp).get(30, TimeUnit.SECONDS)
                        .activeProducers()) ids.add(p.producerId());
                return ids;
            }
            case "alter_configs": alterConfigs(r); return null;
            case "describe_configs": return describeConfigs(r);
            case "describe_cluster": return describeCluster(r);
            case "describe_topic_detail": return describeTopicDetail(r);
            case "group_authorized_operations": {
                String g = str(r, "group");
                ConsumerGroupDescription d = admin().describeConsumerGroups(List.of(g),
                        new DescribeConsumerGroupsOptions().includeAuthorizedOperations(true))
                        .describedGroups().get(g).get(30, TimeUnit.SECONDS);
                return opNames(d.authorizedOperations());
            }
            case "describe_log_dirs": return describeLogDirs(r);
            case "alter_replica_log_dir":
                admin().alterReplicaLogDirs(Map.of(new TopicPartitionReplica(str(r, "topic"), num(r, "partition"),
                        num(r, "broker")), str(r, "path"))).all().get(30, TimeUnit.SECONDS);
                return null;
            case "elect_leaders": return electLeaders(r);
            case "alter_reassignments": return alterReassignments(r);
            case "list_reassignments": return listReassignments(r);
            case "describe_client_quotas": return describeClientQuotas(r);
            case "alter_client_quotas": alterClientQuotas(r); return null;
            case "max_timestamp_offset": {
                TopicPartition tp = new TopicPartition(str(r, "topic"), num(r, "partition"));
                ListOffsetsResult.ListOffsetsResultInfo info = admin().listOffsets(Map.of(tp, OffsetSpec.maxTimestamp()))
                        .partitionResult(tp).get(30, TimeUnit.SECONDS);
                return List.of(info.offset(), info.timestamp());
            }
            case "consume_validated": return consumeValidated(r);
            case "client_instance_id": {
                Properties p = producerProps(r);
                if (r.get("client_id") != null) p.put(ProducerConfig.CLIENT_ID_CONFIG, str(r, "client_id"));
                // KIP-714: the producer asks the broker (GetTelemetrySubscriptions) for its instance id.
                p.put("enable.metrics.push", "true");
                try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
                    String id = producer.clientInstanceId(Duration.ofSeconds(20)).toString();
                    // Stay up a while: a subscribed client pushes its metrics (PushTelemetry) meanwhile,
                    // and once more, terminating, when it closes.
                    double hold = r.get("hold") == null ? 0 : ((Number) r.get("hold")).doubleValue();
                    Thread.sleep((long) (hold * 1000));
                    return id;
                }
            }
            default: throw new IllegalArgumentException("unknown op " + op);
        }
    }

    static String str(Map<String, Object> r, String k) { return (String) r.get(k); }
    static int num(Map<String, Object> r, String k) { return ((Number) r.get(k)).intValue(); }
    static byte[] unb64(Object s) { return s == null ? null : Base64.getDecoder().decode((String) s); }
    static String b64(byte[] b) { return b == null ? null : Base64.getEncoder().encodeToString(b); }

    static synchronized Admin admin() {
        if (admin == null) {
            Properties p = new Properties();
            p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            p.putAll(SECURITY);
            p.put(AdminClientConfig.CLIENT_ID_CONFIG, "compat-java-admin");
            p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "30000");
            p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
            admin = Admin.create(p);
        }
        return admin;
    }

    // --- admin --------------------------------------------------------------------------------
    static Object createTopic(Map<String, Object> r) throws Exception {
        NewTopic t = new NewTopic(str(r, "name"), Optional.of(num(r, "partitions")),
                                  Optional.of((short) num(r, "replication_factor")));
        Map<String, String> cfg = (Map<String, String>) r.get("configs");
        if (cfg != null) t.configs(cfg);
        admin().createTopics(List.of(t)).all().get(30, TimeUnit.SECONDS);
        return null;
    }

    static Object describeTopic(Map<String, Object> r) throws Exception {
        String name = str(r, "name");
        TopicDescription d = admin().describeTopics(List.of(name)).allTopicNames().get(30, TimeUnit.SECONDS).get(name);
        return d.partitions().size();
    }

    static Object topicConfigs(Map<String, Object> r) throws Exception {
        ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, str(r, "name"));
        Config c = admin().describeConfigs(List.of(res)).all().get(30, TimeUnit.SECONDS).get(res);
        Map<String, String> out = new HashMap<>();
        for (ConfigEntry e : c.entries()) out.put(e.name(), e.value());
        return out;
    }

    static Object deleteRecords(Map<String, Object> r) throws Exception {
        TopicPartition tp = new TopicPartition(str(r, "topic"), num(r, "partition"));
        return admin().deleteRecords(Map.of(tp, RecordsToDelete.beforeOffset(((Number) r.get("before")).longValue())))
                .lowWatermarks().get(tp).get(30, TimeUnit.SECONDS).lowWatermark();
    }

    static Object metadata() throws Exception {
        List<Integer> brokers = new ArrayList<>();
        for (Node n : admin().describeCluster().nodes().get(30, TimeUnit.SECONDS)) brokers.add(n.id());
        Collection<String> names = admin().listTopics(new ListTopicsOptions().listInternal(true)).names()
                .get(30, TimeUnit.SECONDS);
        Map<String, Integer> topics = new HashMap<>();
        // Per topic: on a shared cluster a listed topic may be deleted before it is described, or the ACL that
        // let this user see it removed by another scenario (the answering broker may also be another, whose
        // authorizer already has the removal): either way the topic is no longer this user's to see.
        for (Map.Entry<String, org.apache.kafka.common.KafkaFuture<TopicDescription>> e : admin()
                .describeTopics(names, new DescribeTopicsOptions()).topicNameValues().entrySet()) {
            try {
                topics.put(e.getKey(), e.getValue().get(30, TimeUnit.SECONDS).partitions().size());
            } catch (ExecutionException ex) {
                if (!(ex.getCause() instanceof org.apache.kafka.common.errors.UnknownTopicOrPartitionException
                        || ex.getCause() instanceof org.apache.kafka.common.errors.TopicAuthorizationException)) throw ex;
            }
        }
        return Map.of("brokers", brokers, "topics", topics);
    }

    // --- configs and cluster admin -------------------------------------------------------------
    static String errName(Throwable t) {
        while (t instanceof ExecutionException && t.getCause() != null) t = t.getCause();
        return t instanceof ApiException ? Errors.forException(t).name() : t.getClass().getSimpleName();
    }

    static List<String> opNames(java.util.Set<AclOperation> ops) {
        if (ops == null) return null;
        List<String> out = new ArrayList<>();
        for (AclOperation o : ops) out.add(o.name());
        return out;
    }

    static ConfigResource resource(Map<String, Object> r) {
        return new ConfigResource(ConfigResource.Type.valueOf(str(r, "rtype").toUpperCase()), str(r, "name"));
    }

    @SuppressWarnings("deprecation")
    static void alterConfigs(Map<String, Object> r) throws Exception {
        ConfigResource res = resource(r);
        boolean validateOnly = Boolean.TRUE.equals(r.get("validate_only"));
        List<List<Object>> ops = (List<List<Object>>) r.get("ops");
        if (Boolean.TRUE.equals(r.get("incremental"))) {
            List<AlterConfigOp> alter = new ArrayList<>();
            for (List<Object> o : ops) {
                AlterConfigOp.OpType type = AlterConfigOp.OpType.valueOf(((String) o.get(0)).toUpperCase());
                alter.add(new AlterConfigOp(new ConfigEntry((String) o.get(1), (String) o.get(2)), type));
            }
            admin().incrementalAlterConfigs(Map.of(res, alter), new AlterConfigsOptions().validateOnly(validateOnly))
                    .all().get(30, TimeUnit.SECONDS);
        } else {
            List<ConfigEntry> entries = new ArrayList<>();
            for (List<Object> o : ops) {
                if (!"set".equals(o.get(0))) throw new IllegalArgumentException("AlterConfigs only sets configs");
                entries.add(new ConfigEntry((String) o.get(1), (String) o.get(2)));
            }
            admin().alterConfigs(Map.of(res, new Config(entries)), new AlterConfigsOptions().validateOnly(validateOnly))
                    .all().get(30, TimeUnit.SECONDS);
        }
    }

    static Object describeConfigs(Map<String, Object> r) throws Exception {
        ConfigResource res = resource(r);
        boolean synonyms = Boolean.TRUE.equals(r.get("synonyms"));
        Config c = admin().describeConfigs(List.of(res), new DescribeConfigsOptions().includeSynonyms(synonyms))
                .all().get(30, TimeUnit.SECONDS).get(res);
        Map<String, Object> out = new HashMap<>();
        for (ConfigEntry e : c.entries()) {
            Map<String, Object> v = new HashMap<>();
            v.put("value", e.value());
            v.put("source", e.source().name());
            v.put("read_only", e.isReadOnly());
            List<List<Object>> syn = new ArrayList<>();
            for (ConfigEntry.ConfigSynonym s : e.synonyms()) syn.add(java.util.Arrays.asList(s.name(), s.value(), s.source().name()));
            v.put("synonyms", syn);
            out.put(e.name(), v);
        }
        return out;
    }

    static Object describeCluster(Map<String, Object> r) throws Exception {
        boolean ops = Boolean.TRUE.equals(r.get("authorized_operations"));
        DescribeClusterResult d = admin().describeCluster(new DescribeClusterOptions().includeAuthorizedOperations(ops));
        List<Integer> brokers = new ArrayList<>();
        for (Node n : d.nodes().get(30, TimeUnit.SECONDS)) brokers.add(n.id());
        Node controller = d.controller().get(30, TimeUnit.SECONDS);
        Map<String, Object> out = new HashMap<>();
        out.put("cluster_id", d.clusterId().get(30, TimeUnit.SECONDS));
        out.put("controller", controller == null || controller.isEmpty() ? -1 : controller.id());
        out.put("brokers", brokers);
        out.put("authorized_operations", opNames(d.authorizedOperations().get(30, TimeUnit.SECONDS)));
        return out;
    }

    static List<Integer> ids(List<Node> nodes) {
        List<Integer> out = new ArrayList<>();
        for (Node n : nodes) out.add(n.id());
        return out;
    }

    static Object describeTopicDetail(Map<String, Object> r) throws Exception {
        String name = str(r, "name");
        // kafka-clients 3.9 describes topics with DescribeTopicPartitions when the broker offers it.
        TopicDescription d = admin().describeTopics(List.of(name), new DescribeTopicsOptions()
                .includeAuthorizedOperations(Boolean.TRUE.equals(r.get("authorized_operations"))))
                .allTopicNames().get(30, TimeUnit.SECONDS).get(name);
        Map<String, Object> parts = new HashMap<>();
        for (TopicPartitionInfo p : d.partitions()) {
            Map<String, Object> m = new HashMap<>();
            m.put("leader", p.leader() == null ? -1 : p.leader().id());
            m.put("replicas", ids(p.replicas()));
            m.put("isr", ids(p.isr()));
            parts.put(String.valueOf(p.partition()), m);
        }
        Map<String, Object> out = new HashMap<>();
        out.put("topic_id", d.topicId() == null ? null : d.topicId().toString());
        out.put("partitions", parts);
        out.put("authorized_operations", opNames(d.authorizedOperations()));
        return out;
    }

    static Object describeLogDirs(Map<String, Object> r) throws Exception {
        int broker = num(r, "broker");
        Map<String, LogDirDescription> dirs = admin().describeLogDirs(List.of(broker)).descriptions().get(broker)
                .get(30, TimeUnit.SECONDS);
        Map<String, Object> out = new HashMap<>();
        for (Map.Entry<String, LogDirDescription> e : dirs.entrySet()) {
            List<Map<String, Object>> replicas = new ArrayList<>();
            for (Map.Entry<TopicPartition, ReplicaInfo> ri : e.getValue().replicaInfos().entrySet()) {
                replicas.add(Map.of("topic", ri.getKey().topic(), "partition", ri.getKey().partition(),
                        "size", ri.getValue().size(), "future", ri.getValue().isFuture()));
            }
            Map<String, Object> d = new HashMap<>();
            d.put("error", e.getValue().error() == null ? null : Errors.forException(e.getValue().error()).name());
            d.put("replicas", replicas);
            out.put(e.getKey(), d);
        }
        return out;
    }

    static java.util.Set<TopicPartition> tps(Map<String, Object> r) {
        java.util.Set<TopicPartition> out = new java.util.HashSet<>();
        for (Object p : (List<Object>) r.get("partitions")) out.add(new TopicPartition(str(r, "topic"), ((Number) p).intValue()));
        return out;
    }

    static Object electLeaders(Map<String, Object> r) throws Exception {
        Map<TopicPartition, Optional<Throwable>> res = admin().electLeaders(ElectionType.PREFERRED, tps(r))
                .partitions().get(30, TimeUnit.SECONDS);
        Map<String, Object> out = new HashMap<>();
        for (Map.Entry<TopicPartition, Optional<Throwable>> e : res.entrySet()) {
            out.put(String.valueOf(e.getKey().partition()), e.getValue().map(CompatDriver::errName).orElse(null));
        }
        return out;
    }

    static Object alterReassignments(Map<String, Object> r) throws Exception {
        Map<TopicPartition, Optional<NewPartitionReassignment>> req = new HashMap<>();
        for (Map.Entry<String, Object> e : ((Map<String, Object>) r.get("targets")).entrySet()) {
            List<Integer> replicas = (List<Integer>) e.getValue();
            req.put(new TopicPartition(str(r, "topic"), Integer.parseInt(e.getKey())),
                    replicas == null ? Optional.empty() : Optional.of(new NewPartitionReassignment(replicas)));
        }
        Map<String, Object> out = new HashMap<>();
        for (Map.Entry<TopicPartition, KafkaFuture<Void>> e : admin().alterPartitionReassignments(req).values().entrySet()) {
            String err = null;
            try {
                e.getValue().get(30, TimeUnit.SECONDS);
            } catch (ExecutionException ex) {
                err = errName(ex);
            }
            out.put(String.valueOf(e.getKey().partition()), err);
        }
        return out;
    }

    static Object listReassignments(Map<String, Object> r) throws Exception {
        Map<TopicPartition, PartitionReassignment> res = admin().listPartitionReassignments(tps(r)).reassignments()
                .get(30, TimeUnit.SECONDS);
        Map<String, Object> out = new HashMap<>();
        for (Map.Entry<TopicPartition, PartitionReassignment> e : res.entrySet()) {
            out.put(String.valueOf(e.getKey().partition()), Map.of("replicas", e.getValue().replicas(),
                    "adding", e.getValue().addingReplicas(), "removing", e.getValue().removingReplicas()));
        }
        return out;
    }

    static Object describeClientQuotas(Map<String, Object> r) throws Exception {
        Map<String, String> entity = (Map<String, String>) r.get("entity");
        List<ClientQuotaFilterComponent> comps = new ArrayList<>();
        for (Map.Entry<String, String> e : entity.entrySet()) comps.add(ClientQuotaFilterComponent.ofEntity(e.getKey(), e.getValue()));
        Map<ClientQuotaEntity, Map<String, Double>> res = admin().describeClientQuotas(ClientQuotaFilter.containsOnly(comps))
                .entities().get(30, TimeUnit.SECONDS);
        Map<String, Double> q = res.get(new ClientQuotaEntity(entity));
        return q == null ? Map.of() : q;
    }

    static void alterClientQuotas(Map<String, Object> r) throws Exception {
        Map<String, String> entity = (Map<String, String>) r.get("entity");
        List<ClientQuotaAlteration.Op> ops = new ArrayList<>();
        for (Map.Entry<String, Object> e : ((Map<String, Object>) r.get("quotas")).entrySet()) {
            ops.add(new ClientQuotaAlteration.Op(e.getKey(), e.getValue() == null ? null : ((Number) e.getValue()).doubleValue()));
        }
        admin().alterClientQuotas(List.of(new ClientQuotaAlteration(new ClientQuotaEntity(entity), ops)),
                new AlterClientQuotasOptions().validateOnly(Boolean.TRUE.equals(r.get("validate_only"))))
                .all().get(30, TimeUnit.SECONDS);
    }

    static Object consumeValidated(Map<String, Object> r) throws Exception {
        Properties p = consumerProps(null);
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "none");
        TopicPartition tp = new TopicPartition(str(r, "topic"), num(r, "partition"));
        long offset = ((Number) r.get("offset")).longValue();
        int count = num(r, "count");
        long deadline = System.nanoTime() + (long) (((Number) r.get("timeout")).doubleValue() * 1e9);
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p)) {
            c.assign(List.of(tp));
            c.seek(tp, offset);
            Optional<Integer> epoch = Optional.empty();
            while (System.nanoTime() < deadline) {
                ConsumerRecords<byte[], byte[]> batch = c.poll(Duration.ofMillis(200));
                List<ConsumerRecord<byte[], byte[]>> recs = batch.records(tp);
                if (!recs.isEmpty()) {
                    epoch = recs.get(0).leaderEpoch();
                    break;
                }
            }
            if (epoch.isEmpty()) throw new IllegalStateException("the record at " + offset + " carries no leader epoch");
            // A position with a leader epoch is validated (OffsetsForLeaderEpoch) before the next fetch.
            c.seek(tp, new OffsetAndMetadata(offset, epoch, ""));
            List<Map<String, Object>> out = new ArrayList<>();
            while (out.size() < count && System.nanoTime() < deadline) {
                for (ConsumerRecord<byte[], byte[]> cr : c.poll(Duration.ofMillis(200))) out.add(rec(cr));
            }
            return out;
        }
    }

    // --- produce ------------------------------------------------------------------------------
    static Properties producerProps(Map<String, Object> r) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.putAll(SECURITY);
        p.put(ProducerConfig.CLIENT_ID_CONFIG, "compat-java-producer-" + SEQ.incrementAndGet());
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.MAX_REQUEST_SIZE_CONFIG, "10000000");
        p.put(ProducerConfig.BUFFER_MEMORY_CONFIG, "67108864");
        int timeoutMs = (int) (((Number) r.getOrDefault("timeout", 30)).doubleValue() * 1000);
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, String.valueOf(timeoutMs));
        p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, String.valueOf(Math.max(1000, timeoutMs / 2)));
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, String.valueOf(timeoutMs));
        return p;
    }

    static ProducerRecord<byte[], byte[]> record(String topic, Map<String, Object> m) {
        List<Header> headers = new ArrayList<>();
        for (List<Object> h : (List<List<Object>>) m.getOrDefault("headers", List.of())) {
            headers.add(new RecordHeader((String) h.get(0), unb64(h.get(1))));
        }
        Integer partition = m.get("partition") == null ? null : ((Number) m.get("partition")).intValue();
        Long ts = m.get("timestamp") == null ? null : ((Number) m.get("timestamp")).longValue();
        return new ProducerRecord<>(topic, partition, ts, unb64(m.get("key")), unb64(m.get("value")), headers);
    }

    static Object produce(Map<String, Object> r) throws Exception {
        Properties p = producerProps(r);
        p.put(ProducerConfig.ACKS_CONFIG, str(r, "acks"));
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, str(r, "compression"));
        boolean idem = Boolean.TRUE.equals(r.get("idempotent"));
        // Idempotence is on by default since Kafka 3.0; the suite asks for it explicitly.
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, String.valueOf(idem));
        if (idem) p.put(ProducerConfig.MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION, "5");
        else p.put(ProducerConfig.MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION, "1");
        if ("0".equals(str(r, "acks"))) p.put(ProducerConfig.RETRIES_CONFIG, "0");
        String topic = str(r, "topic");
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            List<Future<RecordMetadata>> fs = new ArrayList<>();
            for (Map<String, Object> m : (List<Map<String, Object>>) r.get("msgs")) fs.add(producer.send(record(topic, m)));
            producer.flush();
            List<Map<String, Object>> out = new ArrayList<>();
            for (Future<RecordMetadata> f : fs) {
                RecordMetadata md = f.get(60, TimeUnit.SECONDS);
                out.add(Map.of("partition", md.partition(), "offset", md.hasOffset() ? md.offset() : -1));
            }
            return out;
        }
    }

    static KafkaProducer<byte[], byte[]> txnProducer(Map<String, Object> r) {
        Properties p = producerProps(r);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, str(r, "transactional_id"));
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "60000");
        KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p);
        producer.initTransactions();
        return producer;
    }

    static void produceTransactions(Map<String, Object> r) throws Exception {
        String topic = str(r, "topic");
        try (KafkaProducer<byte[], byte[]> producer = txnProducer(r)) {
            for (Map<String, Object> txn : (List<Map<String, Object>>) r.get("txns")) {
                producer.beginTransaction();
                List<Future<RecordMetadata>> fs = new ArrayList<>();
                for (Map<String, Object> m : (List<Map<String, Object>>) txn.get("msgs")) fs.add(producer.send(record(topic, m)));
                producer.flush();
                for (Future<RecordMetadata> f : fs) f.get(60, TimeUnit.SECONDS);
                if (Boolean.TRUE.equals(txn.get("commit"))) producer.commitTransaction();
                else producer.abortTransaction();
            }
        }
    }

    static void transactionalOffsets(Map<String, Object> r) throws Exception {
        String topic = str(r, "topic");
        String offTopic = str(r, "offsets_topic");
        try (KafkaProducer<byte[], byte[]> producer = txnProducer(r)) {
            producer.beginTransaction();
            for (Map<String, Object> m : (List<Map<String, Object>>) r.get("msgs")) producer.send(record(topic, m));
            Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
            for (Map.Entry<String, Object> e : ((Map<String, Object>) r.get("offsets")).entrySet()) {
                offsets.put(new TopicPartition(offTopic, Integer.parseInt(e.getKey())),
                            new OffsetAndMetadata(((Number) e.getValue()).longValue()));
            }
            producer.sendOffsetsToTransaction(offsets, new ConsumerGroupMetadata(str(r, "group")));
            if (Boolean.TRUE.equals(r.get("commit"))) producer.commitTransaction();
            else producer.abortTransaction();
        }
    }

    // --- consume ------------------------------------------------------------------------------
    static Properties consumerProps(String groupId) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.putAll(SECURITY);
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, "compat-java-consumer-" + SEQ.incrementAndGet());
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "100");
        p.put(ConsumerConfig.MAX_PARTITION_FETCH_BYTES_CONFIG, "2000000");
        p.put(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        if (groupId != null) p.put(ConsumerConfig.GROUP_ID_CONFIG, groupId);
        return p;
    }

    static Map<String, Object> rec(ConsumerRecord<byte[], byte[]> cr) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("topic", cr.topic());
        m.put("partition", cr.partition());
        m.put("offset", cr.offset());
        m.put("timestamp", cr.timestamp());
        m.put("key", b64(cr.key()));
        m.put("value", b64(cr.value()));
        List<List<Object>> hs = new ArrayList<>();
        for (Header h : cr.headers()) hs.add(java.util.Arrays.asList(h.key(), b64(h.value())));
        m.put("headers", hs);
        return m;
    }

    static Object consume(Map<String, Object> r) {
        Properties p = consumerProps(null);
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, str(r, "reset"));
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, str(r, "isolation"));
        String topic = str(r, "topic");
        int count = num(r, "count");
        long deadline = System.nanoTime() + (long) (((Number) r.get("timeout")).doubleValue() * 1e9);
        Double idle = r.get("idle") == null ? null : ((Number) r.get("idle")).doubleValue();
        List<Map<String, Object>> out = new ArrayList<>();
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p)) {
            List<TopicPartition> tps = new ArrayList<>();
            for (Object part : (List<Object>) r.get("partitions")) tps.add(new TopicPartition(topic, ((Number) part).intValue()));
            c.assign(tps);
            Object start = r.get("start");
            if ("earliest".equals(start)) c.seekToBeginning(tps);
            else if ("latest".equals(start)) c.seekToEnd(tps);
            else for (TopicPartition tp : tps) c.seek(tp, ((Number) start).longValue());
            long last = System.nanoTime();
            while (out.size() < count && System.nanoTime() < deadline) {
                if (idle != null && System.nanoTime() - last > idle * 1e9) break;
                ConsumerRecords<byte[], byte[]> batch = c.poll(Duration.ofMillis(200));
                for (ConsumerRecord<byte[], byte[]> cr : batch) {
                    out.add(rec(cr));
                    last = System.nanoTime();
                }
            }
        }
        return out;
    }

    static Object listOffset(Map<String, Object> r) throws Exception {
        TopicPartition tp = new TopicPartition(str(r, "topic"), num(r, "partition"));
        Object spec = r.get("spec");
        OffsetSpec s = "earliest".equals(spec) ? OffsetSpec.earliest()
                : "latest".equals(spec) ? OffsetSpec.latest()
                : OffsetSpec.forTimestamp(((Number) spec).longValue());
        ListOffsetsResult.ListOffsetsResultInfo info = admin().listOffsets(Map.of(tp, s)).partitionResult(tp)
                .get(30, TimeUnit.SECONDS);
        return info.offset();
    }

    // --- groups -------------------------------------------------------------------------------
    static Object startMember(Map<String, Object> r) {
        Properties p = consumerProps(str(r, "group"));
        String protocol = str(r, "protocol");
        p.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol);
        if ("classic".equals(protocol)) {
            String assignor = "range".equals(str(r, "assignor"))
                    ? "org.apache.kafka.clients.consumer.RangeAssignor"
                    : "org.apache.kafka.clients.consumer.RoundRobinAssignor";
            p.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, assignor);
            p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, String.valueOf(num(r, "session_timeout_ms")));
            p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "500");
        }
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, str(r, "reset"));
        boolean autoCommit = Boolean.TRUE.equals(r.get("auto_commit"));
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, String.valueOf(autoCommit));
        p.put(ConsumerConfig.AUTO_COMMIT_INTERVAL_MS_CONFIG, "200");
        Member m = new Member(p, (List<String>) r.get("topics"), autoCommit);
        String id = "m" + SEQ.incrementAndGet();
        MEMBERS.put(id, m);
        m.thread.start();
        return id;
    }

    static class Member {
        final KafkaConsumer<byte[], byte[]> consumer;
        final List<String> topics;
        final boolean autoCommit;
        final List<Map<String, Object>> records = new ArrayList<>();
        volatile List<List<Object>> assignment = List.of();
        volatile String error;
        volatile boolean failed;  // poll() threw: the member has stopped for good
        volatile boolean stop;
        final Thread thread;

        Member(Properties p, List<String> topics, boolean autoCommit) {
            this.consumer = new KafkaConsumer<>(p);
            this.topics = topics;
            this.autoCommit = autoCommit;
            this.thread = new Thread(this::run);
            this.thread.setDaemon(true);
        }

        void run() {
            try {
                consumer.subscribe(topics);
                while (!stop) {
                    ConsumerRecords<byte[], byte[]> batch = consumer.poll(Duration.ofMillis(100));
                    List<List<Object>> a = new ArrayList<>();
                    for (TopicPartition tp : consumer.assignment()) a.add(List.of(tp.topic(), tp.partition()));
                    assignment = a;
                    if (!batch.isEmpty()) {
                        synchronized (records) {
                            for (ConsumerRecord<byte[], byte[]> cr : batch) records.add(rec(cr));
                        }
                        if (!autoCommit) consumer.commitSync();
                    }
                }
            } catch (Throwable t) {
                error = t.toString();
                failed = true;
            } finally {
                try {
                    consumer.close(Duration.ofSeconds(10));
                } catch (Throwable t) {
                    if (error == null) error = "close: " + t;
                }
            }
        }

        Map<String, Object> state() {
            Map<String, Object> s = new LinkedHashMap<>();
            s.put("assignment", assignment);
            synchronized (records) {
                s.put("records", new ArrayList<>(records));
                records.clear();
            }
            s.put("error", error);
            s.put("failed", failed);
            return s;
        }

        void close() throws InterruptedException {
            stop = true;
            thread.join(30000);
        }
    }

    static void commitOffsets(Map<String, Object> r) {
        Properties p = consumerProps(str(r, "group"));
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        String topic = str(r, "topic");
        Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
        for (Map.Entry<String, Object> e : ((Map<String, Object>) r.get("offsets")).entrySet()) {
            offsets.put(new TopicPartition(topic, Integer.parseInt(e.getKey())),
                        new OffsetAndMetadata(((Number) e.getValue()).longValue()));
        }
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p)) {
            c.commitSync(offsets, Duration.ofSeconds(30));
        }
    }

    static Object committedOffsets(Map<String, Object> r) throws Exception {
        String topic = str(r, "topic");
        Map<TopicPartition, OffsetAndMetadata> got = admin().listConsumerGroupOffsets(str(r, "group"))
                .partitionsToOffsetAndMetadata().get(30, TimeUnit.SECONDS);
        Map<String, Long> out = new HashMap<>();
        for (Object part : (List<Object>) r.get("partitions")) {
            OffsetAndMetadata om = got.get(new TopicPartition(topic, ((Number) part).intValue()));
            out.put(String.valueOf(part), om == null ? -1L : om.offset());
        }
        return out;
    }
}
