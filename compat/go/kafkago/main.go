// segmentio kafka-go (github.com/segmentio/kafka-go) driven by the compatibility suite: Writer, Reader
// (one per assigned partition), ConsumerGroup (generations, with the Reader per assigned partition), and
// the protocol-level Client for administration. One long-lived process per test worker speaking
// compat/go/rpc's JSON lines.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"compat/go/rpc"

	kafka "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

const version = "kafka-go v0.4.51"

var (
	bootstrap string
	mechanism sasl.Mechanism
	seq       atomic.Int64
	client    *kafka.Client
	members   rpc.Members[*member]
)

func classify(err error) int16 {
	var ke kafka.Error
	if errors.As(err, &ke) {
		return int16(ke)
	}
	var we kafka.WriteErrors
	if errors.As(err, &we) {
		for _, e := range we {
			if e != nil {
				return classify(e)
			}
		}
	}
	return -1
}

func main() {
	addr, s := rpc.Args()
	bootstrap = addr
	if s != nil {
		var err error
		switch s.Mechanism {
		case "PLAIN":
			mechanism = plain.Mechanism{Username: s.Username, Password: s.Password}
		case "SCRAM-SHA-256":
			mechanism, err = scram.Mechanism(scram.SHA256, s.Username, s.Password)
		case "SCRAM-SHA-512":
			mechanism, err = scram.Mechanism(scram.SHA512, s.Username, s.Password)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	client = &kafka.Client{Addr: kafka.TCP(bootstrap), Timeout: 30 * time.Second, Transport: transport("admin")}
	ops := map[string]rpc.Handler{
		"ping":                     func(rpc.Req) (any, error) { return "pong", nil },
		"create_topic":             createTopic,
		"delete_topic":             deleteTopic,
		"create_partitions":        createPartitions,
		"describe_topic":           describeTopic,
		"topic_configs":            topicConfigs,
		"metadata":                 metadata,
		"produce":                  produce,
		"consume":                  consume,
		"list_offset":              listOffset,
		"start_member":             startMember,
		"member_state":             memberState,
		"member_close":             memberClose,
		"commit_offsets":           commitOffsets,
		"committed_offsets":        committedOffsets,
		"list_groups":              listGroups,
		"describe_group":           describeGroup,
		"delete_group":             deleteGroup,
		"delete_committed_offsets": deleteCommittedOffsets,
		"alter_configs":            alterConfigs,
		"describe_configs":         describeConfigs,
		"describe_cluster":         describeCluster,
		"elect_leaders":            electLeaders,
		"alter_reassignments":      alterReassignments,
		"list_reassignments":       listReassignments,
		"describe_client_quotas":   describeClientQuotas,
		"alter_client_quotas":      alterClientQuotas,
	}
	rpc.Serve(version, ops, classify, func() {
		for _, m := range members.All() {
			m.close()
		}
	})
}

// --- clients ---------------------------------------------------------------------------------------

func clientID(role string) string { return fmt.Sprintf("compat-kafka-go-%s-%d", role, seq.Add(1)) }

func transport(role string) *kafka.Transport {
	return &kafka.Transport{ClientID: clientID(role), SASL: mechanism, DialTimeout: 10 * time.Second,
		MetadataTTL: time.Second}
}

// topicTransport asks the brokers about the one topic only. kafka-go answers a Writer's metadata lookups
// from its Transport's cache, which it fills with Metadata for all topics unless told which: a topic the
// principal may not DESCRIBE is left out of that answer (as Kafka documents), so kafka-go would make up
// UNKNOWN_TOPIC_OR_PARTITION instead of the broker's TOPIC_AUTHORIZATION_FAILED for that topic.
func topicTransport(role, topic string) *kafka.Transport {
	t := transport(role)
	t.MetadataTopics = []string{topic}
	return t
}

// fresh is a Client of its own Transport, for a Metadata answer from the broker now: kafka-go answers
// Metadata from its Transport's cache, refreshed in the background (MetadataTTL), so a long-lived
// Client may describe the cluster as it was before the last change. topics: what it asks about (nil:
// all topics).
func fresh(topics []string) (*kafka.Client, func()) {
	t := transport("metadata")
	t.MetadataTopics = topics
	return &kafka.Client{Addr: kafka.TCP(bootstrap), Timeout: 30 * time.Second, Transport: t}, t.CloseIdleConnections
}

func dialer(role string) *kafka.Dialer {
	return &kafka.Dialer{ClientID: clientID(role), Timeout: 10 * time.Second, DualStack: true, SASLMechanism: mechanism}
}

func logger() kafka.Logger {
	if os.Getenv("COMPAT_KAFKAGO_LOG") == "" {
		return nil
	}
	return log.New(os.Stderr, "[kafka-go] ", log.LstdFlags)
}

func ctx30() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

func seconds(r rpc.Req, k string, dflt float64) time.Duration {
	f := r.Float(k)
	if !r.Has(k) || f <= 0 {
		f = dflt
	}
	return time.Duration(f * float64(time.Second))
}

func noError(err error) error {
	if err == nil {
		return nil
	}
	var ke kafka.Error
	if errors.As(err, &ke) && ke == 0 {
		return nil
	}
	return err
}

// --- topic admin -----------------------------------------------------------------------------------

func createTopic(r rpc.Req) (any, error) {
	ctx, cancel := ctx30()
	defer cancel()
	cfg := kafka.TopicConfig{Topic: r.Str("name"), NumPartitions: int(r.Int("partitions")),
		ReplicationFactor: int(r.Int("replication_factor"))}
	for k, v := range r.StrMap("configs") {
		cfg.ConfigEntries = append(cfg.ConfigEntries, kafka.ConfigEntry{ConfigName: k, ConfigValue: v})
	}
	resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{cfg}})
	if err != nil {
		return nil, err
	}
	return nil, noError(resp.Errors[r.Str("name")])
}

func deleteTopic(r rpc.Req) (any, error) {
	ctx, cancel := ctx30()
	defer cancel()
	resp, err := client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{r.Str("name")}})
	if err != nil {
		return nil, err
	}
	return nil, noError(resp.Errors[r.Str("name")])
}

func createPartitions(r rpc.Req) (any, error) {
	ctx, cancel := ctx30()
	defer cancel()
	resp, err := client.CreatePartitions(ctx, &kafka.CreatePartitionsRequest{Topics: []kafka.TopicPartitionsConfig{{
		Name: r.Str("name"), Count: int32(r.Int("total"))}}})
	if err != nil {
		return nil, err
	}
	return nil, noError(resp.Errors[r.Str("name")])
}

func describeTopic(r rpc.Req) (any, error) {
	ctx, cancel := ctx30()
	defer cancel()
	c, done := fresh([]string{r.Str("name")})
	defer done()
	md, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{r.Str("name")}})
	if err != nil {
		return nil, err
	}
	for _, t := range md.Topics {
		if t.Name == r.Str("name") {
			if err := noError(t.Error); err != nil {
				return nil, err
			}
			return len(t.Partitions), nil
		}
	}
	return nil, kafka.UnknownTopicOrPartition
}

func metadata(rpc.Req) (any, error) {
	ctx, cancel := ctx30()
	defer cancel()
	c, done := fresh(nil)
	defer done()
	md, err := c.Metadata(ctx, &kafka.MetadataRequest{})
	if err != nil {
		return nil, err
	}
	brokers := []int{}
	for _, b := range md.Brokers {
		brokers = append(brokers, b.ID)
	}
	topics := map[string]int{}
	for _, t := range md.Topics {
		if noError(t.Error) == nil {
			topics[t.Name] = len(t.Partitions)
		}
	}
	return map[string]any{"brokers": brokers, "topics": topics, "cluster_id": md.ClusterID}, nil
}

// describeCluster: kafka-go has no DescribeCluster; its Metadata answer names the cluster and controller.
func describeCluster(r rpc.Req) (any, error) {
	if r.Bool("authorized_operations") {
		return nil, rpc.Unsupported("the cluster's authorized operations")
	}
	ctx, cancel := ctx30()
	defer cancel()
	c, done := fresh(nil)
	defer done()
	md, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{}})
	if err != nil {
		return nil, err
	}
	brokers := []int{}
	for _, b := range md.Brokers {
		brokers = append(brokers, b.ID)
	}
	return map[string]any{"cluster_id": md.ClusterID, "controller": md.Controller.ID, "brokers": brokers,
		"authorized_operations": nil}, nil
}

// --- produce ---------------------------------------------------------------------------------------

var codecs = map[string]kafka.Compression{"gzip": kafka.Gzip, "snappy": kafka.Snappy, "lz4": kafka.Lz4,
	"zstd": kafka.Zstd}

func allExplicit(msgs []rpc.Msg) bool {
	for _, m := range msgs {
		if m.Partition < 0 {
			return false
		}
	}
	return len(msgs) > 0
}

// explicitPartition: kafka-go's Writer lets its Balancer choose every partition; this one takes the
// partition the message names.
var explicitPartition = kafka.BalancerFunc(func(m kafka.Message, partitions ...int) int { return m.Partition })

func produce(r rpc.Req) (any, error) {
	msgs := r.Msgs("msgs")
	explicit := allExplicit(msgs)
	timeout := seconds(r, "timeout", 30)
	w := &kafka.Writer{
		Addr: kafka.TCP(bootstrap), Topic: r.Str("topic"), Transport: topicTransport("producer", r.Str("topic")),
		Balancer: &kafka.Murmur2Balancer{}, BatchSize: 100000, BatchBytes: 16 << 20,
		BatchTimeout: 5 * time.Millisecond, WriteTimeout: timeout, MaxAttempts: 10,
		WriteBackoffMin: 100 * time.Millisecond, WriteBackoffMax: 2 * time.Second,
		AllowAutoTopicCreation: false, Logger: logger(),
	}
	if explicit {
		w.Balancer = explicitPartition
	}
	switch r.Str("acks") {
	case "0":
		w.RequiredAcks = kafka.RequireNone
	case "1":
		w.RequiredAcks = kafka.RequireOne
	default:
		w.RequiredAcks = kafka.RequireAll
	}
	if r.Bool("idempotent") {
		return nil, rpc.Unsupported("the idempotent producer")
	}
	if c, ok := codecs[r.Str("compression")]; ok {
		w.Compression = c
	}
	var mu sync.Mutex
	offsets := map[int][]int64{}
	w.Completion = func(done []kafka.Message, err error) {
		if err != nil {
			return
		}
		mu.Lock()
		for _, m := range done {
			offsets[m.Partition] = append(offsets[m.Partition], m.Offset)
		}
		mu.Unlock()
	}
	km := make([]kafka.Message, 0, len(msgs))
	for _, m := range msgs {
		if !explicit && m.Partition >= 0 {
			return nil, rpc.Unsupported("records with and without a partition in one call")
		}
		msg := kafka.Message{Key: m.Key, Value: m.Value, Partition: int(m.Partition)}
		if m.Timestamp >= 0 {
			msg.Time = time.UnixMilli(m.Timestamp)
		}
		for _, h := range m.Headers {
			msg.Headers = append(msg.Headers, kafka.Header{Key: h.Key, Value: h.Value})
		}
		km = append(km, msg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout+10*time.Second)
	defer cancel()
	err := w.WriteMessages(ctx, km...)
	cerr := w.Close()
	if err != nil {
		return nil, err
	}
	if cerr != nil {
		return nil, cerr
	}
	// Each partition's offsets in the order its messages were given (one batch per partition and call).
	out := make([]any, 0, len(km))
	for _, m := range km {
		if !explicit || r.Str("acks") == "0" || len(offsets[m.Partition]) == 0 {
			out = append(out, rpc.Delivery(int32(m.Partition), -1))
			continue
		}
		out = append(out, rpc.Delivery(int32(m.Partition), offsets[m.Partition][0]))
		offsets[m.Partition] = offsets[m.Partition][1:]
	}
	return out, nil
}

// --- consume ---------------------------------------------------------------------------------------

func recordOut(m kafka.Message) map[string]any {
	hs := make([]rpc.Header, 0, len(m.Headers))
	for _, h := range m.Headers {
		hs = append(hs, rpc.Header{Key: h.Key, Value: h.Value})
	}
	return rpc.Record(m.Topic, int32(m.Partition), m.Offset, m.Time.UnixMilli(), m.Key, m.Value, hs)
}

func readerConfig(topic string, partition int, isolation string) kafka.ReaderConfig {
	c := kafka.ReaderConfig{Brokers: []string{bootstrap}, Topic: topic, Partition: partition,
		Dialer: dialer("consumer"), MinBytes: 1, MaxBytes: 16 << 20, MaxWait: 100 * time.Millisecond,
		ReadBatchTimeout: 2 * time.Second, Logger: logger(), ErrorLogger: logger(), MaxAttempts: 5}
	if isolation == "read_committed" {
		c.IsolationLevel = kafka.ReadCommitted
	}
	return c
}

// consume: a Reader per partition. kafka-go has no auto.offset.reset for an assigned partition: it
// skips forward to the log start when behind it and waits at an offset past the end; with
// OffsetOutOfRangeError it reports OFFSET_OUT_OF_RANGE instead, which is "none". Any other reset of a
// start offset out of range is reported as not supported once the broker's answer shows it is needed.
func consume(r rpc.Req) (any, error) {
	topic := r.Str("topic")
	start := kafka.FirstOffset
	explicitStart := false
	switch s := r["start"].(type) {
	case string:
		if s == "latest" {
			start = kafka.LastOffset
		}
	default:
		start, explicitStart = r.Int("start"), true
	}
	ctx, cancel := context.WithTimeout(context.Background(), seconds(r, "timeout", 20))
	defer cancel()
	out := make(chan kafka.Message, 1024)
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	var readers []*kafka.Reader
	defer func() {
		cancel()
		for _, rd := range readers {
			rd.Close()
		}
		wg.Wait()
	}()
	for _, p := range r.Ints("partitions") {
		c := readerConfig(topic, int(p), r.Str("isolation"))
		c.OffsetOutOfRangeError = explicitStart
		rd := kafka.NewReader(c)
		readers = append(readers, rd)
		if err := rd.SetOffset(start); err != nil {
			return nil, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				m, err := rd.ReadMessage(ctx)
				if err != nil {
					if ctx.Err() == nil {
						select {
						case errs <- err:
						default:
						}
					}
					return
				}
				select {
				case out <- m:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	count := int(r.Int("count"))
	idle := r.Float("idle")
	got := []any{}
	last := time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for len(got) < count {
		select {
		case m := <-out:
			got = append(got, recordOut(m))
			last = time.Now()
		case err := <-errs:
			if errors.Is(err, kafka.OffsetOutOfRange) && r.Str("reset") != "none" {
				return nil, rpc.Unsupported("auto.offset.reset=%s for an assigned partition (kafka-go skips to the "+
					"log start when behind it and waits at an offset past the end)", r.Str("reset"))
			}
			return got, err
		case <-tick.C:
			if idle > 0 && time.Since(last) > time.Duration(idle*float64(time.Second)) {
				return got, nil
			}
		case <-ctx.Done():
			return got, nil
		}
	}
	return got, nil
}

func listOffset(r rpc.Req) (any, error) {
	ctx, cancel := ctx30()
	defer cancel()
	topic, p := r.Str("topic"), int(r.Int("partition"))
	// kafka-go sends each partition's ListOffsets to the leader its Transport's cache names, and to any
	// broker for a topic the cache does not have yet: a Transport of its own asks about the topic first.
	c, done := fresh([]string{topic})
	defer done()
	var req kafka.OffsetRequest
	switch s := r["spec"].(type) {
	case string:
		if s == "latest" {
			req = kafka.LastOffsetOf(p)
		} else {
			req = kafka.FirstOffsetOf(p)
		}
	default:
		req = kafka.TimeOffsetOf(p, time.UnixMilli(r.Int("spec")))
	}
	resp, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: {req}}})
	if err != nil {
		return nil, err
	}
	for _, po := range resp.Topics[topic] {
		if po.Partition != p {
			continue
		}
		if err := noError(po.Error); err != nil {
			return nil, err
		}
		switch req.Timestamp {
		case kafka.FirstOffset:
			return po.FirstOffset, nil
		case kafka.LastOffset:
			return po.LastOffset, nil
		}
		for off := range po.Offsets { // the broker's one answer, -1 when no record is that late
			return off, nil
		}
	}
	return nil, fmt.Errorf("no answer for %s/%d", topic, p)
}

// --- groups ----------------------------------------------------------------------------------------

type member struct {
	cg     *kafka.ConsumerGroup
	state  *rpc.MemberState
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

func fatal(err error) bool {
	var ke kafka.Error
	if errors.As(err, &ke) {
		return !ke.Temporary() && !ke.Timeout()
	}
	return false
}

// startMember runs kafka-go's ConsumerGroup: each generation names the member's partitions and the
// offset each starts at; a Reader per partition reads them, and the generation commits (after each
// record, or every 200 ms with auto_commit).
func startMember(r rpc.Req) (any, error) {
	if r.Str("protocol") != "classic" {
		return nil, rpc.Unsupported("group.protocol=consumer")
	}
	var balancer kafka.GroupBalancer
	switch r.Str("assignor") {
	case "roundrobin":
		balancer = kafka.RoundRobinGroupBalancer{}
	case "range":
		balancer = kafka.RangeGroupBalancer{}
	default:
		return nil, rpc.Unsupported("assignor %s", r.Str("assignor"))
	}
	start := kafka.FirstOffset
	if r.Str("reset") == "latest" {
		start = kafka.LastOffset
	}
	cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID: r.Str("group"), Brokers: []string{bootstrap}, Dialer: dialer("member"), Topics: r.Strs("topics"),
		GroupBalancers: []kafka.GroupBalancer{balancer}, HeartbeatInterval: 500 * time.Millisecond,
		SessionTimeout:   time.Duration(r.Int("session_timeout_ms")) * time.Millisecond,
		RebalanceTimeout: 30 * time.Second, JoinGroupBackoff: 500 * time.Millisecond, StartOffset: start,
		WatchPartitionChanges: true, PartitionWatchInterval: time.Second, Timeout: 10 * time.Second,
		Logger: logger(), ErrorLogger: logger(),
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{cg: cg, state: rpc.NewMemberState(), cancel: cancel, done: make(chan struct{})}
	go m.run(ctx, r.Bool("auto_commit"))
	return members.Put(m), nil
}

func (m *member) run(ctx context.Context, autoCommit bool) {
	defer close(m.done)
	for ctx.Err() == nil {
		gen, err := m.cg.Next(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, kafka.ErrGroupClosed) {
				return
			}
			m.state.Fail(rpc.ErrorText(err, classify), fatal(err))
			continue
		}
		assigned := map[string][]int32{}
		for topic, parts := range gen.Assignments {
			for _, pa := range parts {
				assigned[topic] = append(assigned[topic], int32(pa.ID))
			}
		}
		m.state.SetAssignment(assigned)
		for topic, parts := range gen.Assignments {
			for _, pa := range parts {
				m.consumePartition(gen, topic, pa, autoCommit)
			}
		}
	}
}

func (m *member) consumePartition(gen *kafka.Generation, topic string, pa kafka.PartitionAssignment, autoCommit bool) {
	gen.Start(func(ctx context.Context) {
		rd := kafka.NewReader(readerConfig(topic, pa.ID, "read_uncommitted"))
		defer rd.Close()
		if err := rd.SetOffset(pa.Offset); err != nil {
			m.state.Fail(err.Error(), false)
			return
		}
		var next atomic.Int64
		next.Store(-1)
		commit := func() {
			if n := next.Load(); n >= 0 {
				if err := gen.CommitOffsets(map[string]map[int]int64{topic: {pa.ID: n}}); err != nil && ctx.Err() == nil {
					m.state.Fail("commit: "+err.Error(), false)
				}
			}
		}
		if autoCommit {
			go func() {
				t := time.NewTicker(200 * time.Millisecond)
				defer t.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case <-t.C:
						commit()
					}
				}
			}()
		}
		for {
			msg, err := rd.ReadMessage(ctx)
			if err != nil {
				if ctx.Err() == nil {
					m.state.Fail(rpc.ErrorText(err, classify), fatal(err))
				}
				return
			}
			m.state.Add(recordOut(msg))
			next.Store(msg.Offset + 1)
			if !autoCommit {
				commit()
			}
		}
	})
}

func (m *member) close() {
	m.once.Do(func() {
		m.cancel()
		closed := make(chan error, 1)
		go func() { closed <- m.cg.Close() }() // leaves the group
		select {
		case err := <-closed:
			if err != nil {
				m.state.Fail("close: "+err.Error(), false)
			}
		case <-time.After(30 * time.Second):
			m.state.Fail("close: the group did not close in 30s", false)
		}
		select {
		case <-m.done:
		case <-time.After(30 * time.Second):
		}
		m.state.SetAssignment(nil)
	})
}

func memberState(r rpc.Req) (any, error) {
	m, ok := members.Get(r.Str("member"))
	if !ok {
		return nil, fmt.Errorf("no member %s", r.Str("member"))
	}
	return m.state.Take(), nil
}

func memberClose(r rpc.Req) (any, error) {
	m, ok := members.Remove(r.Str("member"))
	if !ok {
		return nil, nil
	}
	m.close()
	return m.state.Take(), nil
}

// coordinator: the group's coordinator, for the group requests kafka-go's Client sends to one address.
func coordinator(ctx context.Context, group string) (net.Addr, error) {
	resp, err := client.FindCoordinator(ctx, &kafka.FindCoordinatorRequest{Key: group, KeyType: kafka.CoordinatorKeyTypeConsumer})
	if err != nil {
		return nil, err
	}
	if err := noError(resp.Error); err != nil {
		return nil, err
	}
	return kafka.TCP(net.JoinHostPort(resp.Coordinator.Host, strconv.Itoa(resp.Coordinator.Port))), nil
}

// withCoordinator runs a group request against the group's coordinator, again (for at most 30 s) while
// the answer is an error Kafka documents as retriable for coordinators: COORDINATOR_LOAD_IN_PROGRESS,
// COORDINATOR_NOT_AVAILABLE (also while __consumer_offsets is being created), NOT_COORDINATOR.
// kafka-go's Client sends each request once; retrying is the application's part.
func withCoordinator(ctx context.Context, group string, fn func(addr net.Addr) error) error {
	for {
		addr, err := coordinator(ctx, group)
		if err == nil {
			err = fn(addr)
		}
		var ke kafka.Error
		if err == nil || !errors.As(err, &ke) ||
			(ke != kafka.GroupLoadInProgress && ke != kafka.GroupCoordinatorNotAvailable && ke != kafka.NotCoordinatorForGroup) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func commitOffsets(r rpc.Req) (any, error) {
	ctx, cancel := ctx30()
	defer cancel()
	var commits []kafka.OffsetCommit
	for p, o := range r.PartitionOffsets("offsets") {
		commits = append(commits, kafka.OffsetCommit{Partition: int(p), Offset: o})
	}
	return nil, withCoordinator(ctx, r.Str("group"), func(addr net.Addr) error {
		resp, err := client.OffsetCommit(ctx, &kafka.OffsetCommitRequest{Addr: addr, GroupID: r.Str("group"),
			GenerationID: -1, Topics: map[string][]kafka.OffsetCommit{r.Str("topic"): commits}})
		if err != nil {
			return err
		}
		for _, ps := range resp.Topics {
			for _, p := range ps {
				if err := noError(p.Error); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

func committedOffsets(r rpc.Req) (any, error) {
	ctx, cancel := ctx30()
	defer cancel()
	topic := r.Str("topic")
	parts := []int{}
	for _, p := range r.Ints("partitions") {
		parts = append(parts, int(p))
	}
	out := map[string]int64{}
	err := withCoordinator(ctx, r.Str("group"), func(addr net.Addr) error {
		resp, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{Addr: addr, GroupID: r.Str("group"),
			Topics: map[string][]int{topic: parts}})
		if err != nil {
			return err
		}
		if err := noError(resp.Error); err != nil {
			return err
		}
		for _, p := range parts {
			out[strconv.Itoa(p)] = -1
		}
		for _, p := range resp.Topics[topic] {
			if err := noError(p.Error); err != nil {
				return err
			}
			if p.CommittedOffset >= 0 {
				out[strconv.Itoa(p.Partition)] = p.CommittedOffset
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// listGroups asks every broker: each lists the groups it coordinates.
func listGroups(rpc.Req) (any, error) {
	ctx, cancel := ctx30()
	defer cancel()
	c, done := fresh(nil)
	defer done()
	md, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{}})
	if err != nil {
		return nil, err
	}
	out := []string{}
	for _, b := range md.Brokers {
		resp, err := client.ListGroups(ctx, &kafka.ListGroupsRequest{Addr: kafka.TCP(net.JoinHostPort(b.Host, strconv.Itoa(b.Port)))})
		if err != nil {
			return nil, err
		}
		if err := noError(resp.Error); err != nil {
			return nil, err
		}
		for _, g := range resp.Groups {
			out = append(out, g.GroupID)
		}
	}
	return out, nil
}

func describeGroup(r rpc.Req) (any, error) {
	ctx, cancel := ctx30()
	defer cancel()
	var out any
	err := withCoordinator(ctx, r.Str("group"), func(addr net.Addr) error {
		resp, err := client.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{Addr: addr, GroupIDs: []string{r.Str("group")}})
		if err != nil {
			return err
		}
		for _, g := range resp.Groups {
			if err := noError(g.Error); err != nil {
				return err
			}
			out = map[string]any{"state": g.GroupState, "members": len(g.Members)}
			return nil
		}
		return fmt.Errorf("group not described")
	})
	return out, err
}

func deleteGroup(r rpc.Req) (any, error) {
	ctx, cancel := ctx30()
	defer cancel()
	return nil, withCoordinator(ctx, r.Str("group"), func(addr net.Addr) error {
		resp, err := client.DeleteGroups(ctx, &kafka.DeleteGroupsRequest{Addr: addr, GroupIDs: []string{r.Str("group")}})
		if err != nil {
			return err
		}
		return noError(resp.Errors[r.Str("group")])
	})
}

func deleteCommittedOffsets(r rpc.Req) (any, error) {
	ctx, cancel := ctx30()
	defer cancel()
	parts := []int{}
	for _, p := range r.Ints("partitions") {
		parts = append(parts, int(p))
	}
	return nil, withCoordinator(ctx, r.Str("group"), func(addr net.Addr) error {
		resp, err := client.OffsetDelete(ctx, &kafka.OffsetDeleteRequest{Addr: addr, GroupID: r.Str("group"),
			Topics: map[string][]int{r.Str("topic"): parts}})
		if err != nil {
			return err
		}
		if err := noError(resp.Error); err != nil {
			return err
		}
		for _, ps := range resp.Topics {
			for _, p := range ps {
				if err := noError(p.Error); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// --- configs ---------------------------------------------------------------------------------------

var resourceTypes = map[string]kafka.ResourceType{"topic": kafka.ResourceTypeTopic, "broker": kafka.ResourceTypeBroker}

var incrementalOps = map[string]kafka.ConfigOperation{"set": kafka.ConfigOperationSet,
	"delete": kafka.ConfigOperationDelete, "append": kafka.ConfigOperationAppend,
	"subtract": kafka.ConfigOperationSubtract}

var sources = map[int8]string{0: "UNKNOWN", 1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG",
	3: "DYNAMIC_DEFAULT_BROKER_CONFIG", 4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG", 6: "DYNAMIC_BROKER_LOGGER_CONFIG",
	7: "CLIENT_METRICS_CONFIG", 8: "GROUP_CONFIG"}

func resource(r rpc.Req) (kafka.ResourceType, error) {
	t, ok := resourceTypes[r.Str("rtype")]
	if !ok {
		return 0, rpc.Unsupported("%s config resources", r.Str("rtype"))
	}
	return t, nil
}

func alterConfigs(r rpc.Req) (any, error) {
	t, err := resource(r)
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	if r.Bool("incremental") {
		res := kafka.IncrementalAlterConfigsRequestResource{ResourceType: t, ResourceName: r.Str("name")}
		for _, op := range r.ConfigOps("ops") {
			o, ok := incrementalOps[op.Op]
			if !ok {
				return nil, fmt.Errorf("bad config op %s", op.Op)
			}
			c := kafka.IncrementalAlterConfigsRequestConfig{Name: op.Key, ConfigOperation: o}
			if op.Value != nil {
				c.Value = *op.Value
			}
			res.Configs = append(res.Configs, c)
		}
		resp, err := client.IncrementalAlterConfigs(ctx, &kafka.IncrementalAlterConfigsRequest{
			Resources: []kafka.IncrementalAlterConfigsRequestResource{res}, ValidateOnly: r.Bool("validate_only")})
		if err != nil {
			return nil, err
		}
		for _, x := range resp.Resources {
			if err := noError(x.Error); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}
	res := kafka.AlterConfigRequestResource{ResourceType: t, ResourceName: r.Str("name")}
	for _, op := range r.ConfigOps("ops") {
		if op.Op != "set" || op.Value == nil {
			return nil, fmt.Errorf("AlterConfigs only sets configs")
		}
		res.Configs = append(res.Configs, kafka.AlterConfigRequestConfig{Name: op.Key, Value: *op.Value})
	}
	resp, err := client.AlterConfigs(ctx, &kafka.AlterConfigsRequest{Resources: []kafka.AlterConfigRequestResource{res},
		ValidateOnly: r.Bool("validate_only")})
	if err != nil {
		return nil, err
	}
	for _, x := range resp.Errors {
		if err := noError(x); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

func describeConfigsOf(r rpc.Req, t kafka.ResourceType, synonyms bool) (map[string]any, error) {
	ctx, cancel := ctx30()
	defer cancel()
	resp, err := client.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{Resources: []kafka.DescribeConfigRequestResource{{
		ResourceType: t, ResourceName: r.Str("name")}}, IncludeSynonyms: synonyms})
	if err != nil {
		return nil, err
	}
	out := map[string]any{}
	for _, res := range resp.Resources {
		if err := noError(res.Error); err != nil {
			return nil, err
		}
		for _, e := range res.ConfigEntries {
			syn := [][]any{}
			for _, s := range e.ConfigSynonyms {
				syn = append(syn, []any{s.ConfigName, s.ConfigValue, sources[s.ConfigSource]})
			}
			out[e.ConfigName] = map[string]any{"value": e.ConfigValue, "source": sources[e.ConfigSource],
				"read_only": e.ReadOnly, "synonyms": syn}
		}
	}
	return out, nil
}

func describeConfigs(r rpc.Req) (any, error) {
	t, err := resource(r)
	if err != nil {
		return nil, err
	}
	return describeConfigsOf(r, t, r.Bool("synonyms"))
}

func topicConfigs(r rpc.Req) (any, error) {
	all, err := describeConfigsOf(r, kafka.ResourceTypeTopic, false)
	if err != nil {
		return nil, err
	}
	out := map[string]any{}
	for k, v := range all {
		out[k] = v.(map[string]any)["value"]
	}
	return out, nil
}

// --- cluster admin ---------------------------------------------------------------------------------

func errorName(err error) any {
	if err = noError(err); err == nil {
		return nil
	}
	var ke kafka.Error
	if errors.As(err, &ke) {
		return rpc.ErrorName(int16(ke))
	}
	return err.Error()
}

func electLeaders(r rpc.Req) (any, error) {
	ctx, cancel := ctx30()
	defer cancel()
	parts := []int{}
	for _, p := range r.Ints("partitions") {
		parts = append(parts, int(p))
	}
	resp, err := client.ElectLeaders(ctx, &kafka.ElectLeadersRequest{Topic: r.Str("topic"), Partitions: parts,
		Timeout: 30 * time.Second})
	if err != nil {
		return nil, err
	}
	if err := noError(resp.Error); err != nil {
		return nil, err
	}
	out := map[string]any{}
	for _, p := range resp.PartitionResults {
		out[strconv.Itoa(p.Partition)] = errorName(p.Error)
	}
	return out, nil
}

func alterReassignments(r rpc.Req) (any, error) {
	ctx, cancel := ctx30()
	defer cancel()
	var as []kafka.AlterPartitionReassignmentsRequestAssignment
	for p, replicas := range r.Targets("targets") {
		if replicas == nil {
			// kafka-go sends an empty replica list, never the null that cancels.
			return nil, rpc.Unsupported("cancelling a partition reassignment")
		}
		ids := []int{}
		for _, b := range replicas {
			ids = append(ids, int(b))
		}
		as = append(as, kafka.AlterPartitionReassignmentsRequestAssignment{PartitionID: int(p), BrokerIDs: ids})
	}
	resp, err := client.AlterPartitionReassignments(ctx, &kafka.AlterPartitionReassignmentsRequest{
		Topic: r.Str("topic"), Assignments: as, Timeout: 30 * time.Second})
	if err != nil {
		return nil, err
	}
	if err := noError(resp.Error); err != nil {
		return nil, err
	}
	out := map[string]any{}
	for _, p := range resp.PartitionResults {
		out[strconv.Itoa(p.PartitionID)] = errorName(p.Error)
	}
	return out, nil
}

func listReassignments(r rpc.Req) (any, error) {
	ctx, cancel := ctx30()
	defer cancel()
	parts := []int{}
	for _, p := range r.Ints("partitions") {
		parts = append(parts, int(p))
	}
	resp, err := client.ListPartitionReassignments(ctx, &kafka.ListPartitionReassignmentsRequest{
		Topics:  map[string]kafka.ListPartitionReassignmentsRequestTopic{r.Str("topic"): {PartitionIndexes: parts}},
		Timeout: 30 * time.Second})
	if err != nil {
		return nil, err
	}
	if err := noError(resp.Error); err != nil {
		return nil, err
	}
	out := map[string]any{}
	for _, p := range resp.Topics[r.Str("topic")].Partitions {
		out[strconv.Itoa(p.PartitionIndex)] = map[string]any{"replicas": p.Replicas, "adding": p.AddingReplicas,
			"removing": p.RemovingReplicas}
	}
	return out, nil
}

func describeClientQuotas(r rpc.Req) (any, error) {
	ctx, cancel := ctx30()
	defer cancel()
	var comps []kafka.DescribeClientQuotasRequestComponent
	for k, v := range r.StrMap("entity") {
		comps = append(comps, kafka.DescribeClientQuotasRequestComponent{EntityType: k, MatchType: 0, Match: v})
	}
	resp, err := client.DescribeClientQuotas(ctx, &kafka.DescribeClientQuotasRequest{Components: comps, Strict: true})
	if err != nil {
		return nil, err
	}
	if err := noError(resp.Error); err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, e := range resp.Entries {
		for _, v := range e.Values {
			out[v.Key] = v.Value
		}
	}
	return out, nil
}

func alterClientQuotas(r rpc.Req) (any, error) {
	ctx, cancel := ctx30()
	defer cancel()
	entry := kafka.AlterClientQuotaEntry{}
	for k, v := range r.StrMap("entity") {
		entry.Entities = append(entry.Entities, kafka.AlterClientQuotaEntity{EntityType: k, EntityName: v})
	}
	for k, v := range r.Quotas("quotas") {
		op := kafka.AlterClientQuotaOps{Key: k, Remove: v == nil}
		if v != nil {
			op.Value = *v
		}
		entry.Ops = append(entry.Ops, op)
	}
	resp, err := client.AlterClientQuotas(ctx, &kafka.AlterClientQuotasRequest{Entries: []kafka.AlterClientQuotaEntry{entry},
		ValidateOnly: r.Bool("validate_only")})
	if err != nil {
		return nil, err
	}
	for _, e := range resp.Entries {
		if err := noError(e.Error); err != nil {
			return nil, err
		}
	}
	return nil, nil
}
