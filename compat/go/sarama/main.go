// IBM Sarama (github.com/IBM/sarama) driven by the compatibility suite: SyncProducer (idempotent and
// transactional), Consumer (manual assignment), ConsumerGroup, ClusterAdmin. One long-lived process per
// test worker speaking compat/go/rpc's JSON lines. Where ClusterAdmin drops a field of the broker's
// answer (the cluster id and authorized operations of DescribeCluster, a group's authorized operations,
// DeleteRecords' low watermark) the driver sends Sarama's own request type through Sarama's Broker.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"compat/go/rpc"

	"github.com/IBM/sarama"
)

const version = "sarama v1.61.1"

// The protocol level Sarama is told the cluster speaks; it still asks each broker's ApiVersions and
// uses no request version above what the broker advertises.
var kafkaVersion = sarama.V4_0_0_0

var (
	bootstrap string
	sasl      *rpc.Sasl
	seq       atomic.Int64
	adminOnce sync.Once
	client    sarama.Client
	admin     sarama.ClusterAdmin
	adminErr  error
	members   rpc.Members[*member]
)

func classify(err error) int16 {
	var ke sarama.KError
	if errors.As(err, &ke) {
		return int16(ke)
	}
	var te *sarama.TopicError
	if errors.As(err, &te) {
		return int16(te.Err)
	}
	var tpe *sarama.TopicPartitionError
	if errors.As(err, &tpe) {
		return int16(tpe.Err)
	}
	var pes sarama.ProducerErrors
	if errors.As(err, &pes) && len(pes) > 0 {
		return classify(pes[0].Err)
	}
	var pe *sarama.ProducerError
	if errors.As(err, &pe) {
		return classify(pe.Err)
	}
	var ce *sarama.ConsumerError
	if errors.As(err, &ce) {
		return classify(ce.Err)
	}
	return -1
}

func main() {
	bootstrap, sasl = rpc.Args()
	if os.Getenv("COMPAT_SARAMA_LOG") != "" {
		sarama.Logger = log.New(os.Stderr, "[sarama] ", log.LstdFlags)
	}
	ops := map[string]rpc.Handler{
		"ping":                        func(rpc.Req) (any, error) { return "pong", nil },
		"create_topic":                createTopic,
		"delete_topic":                deleteTopic,
		"create_partitions":           createPartitions,
		"describe_topic":              describeTopic,
		"topic_configs":               topicConfigs,
		"delete_records":              deleteRecords,
		"metadata":                    metadata,
		"produce":                     produce,
		"produce_transactions":        produceTransactions,
		"transactional_offsets":       transactionalOffsets,
		"consume":                     consume,
		"list_offset":                 listOffset,
		"start_member":                startMember,
		"member_state":                memberState,
		"member_close":                memberClose,
		"commit_offsets":              commitOffsets,
		"committed_offsets":           committedOffsets,
		"list_groups":                 listGroups,
		"describe_group":              describeGroup,
		"delete_group":                deleteGroup,
		"delete_committed_offsets":    deleteCommittedOffsets,
		"list_transactions":           listTransactions,
		"describe_transaction":        describeTransaction,
		"describe_producers":          describeProducers,
		"alter_configs":               alterConfigs,
		"describe_configs":            describeConfigs,
		"describe_cluster":            describeCluster,
		"topic_authorized_operations": topicAuthorizedOperations,
		"group_authorized_operations": groupAuthorizedOperations,
		"describe_log_dirs":           describeLogDirs,
		"elect_leaders":               electLeaders,
		"alter_reassignments":         alterReassignments,
		"list_reassignments":          listReassignments,
		"describe_client_quotas":      describeClientQuotas,
		"alter_client_quotas":         alterClientQuotas,
	}
	rpc.Serve(version, ops, classify, func() {
		for _, m := range members.All() {
			m.close()
		}
		if admin != nil {
			admin.Close()
		}
	})
}

// --- clients ---------------------------------------------------------------------------------------

func config(role string) *sarama.Config {
	c := sarama.NewConfig()
	c.Version = kafkaVersion
	c.ClientID = fmt.Sprintf("compat-sarama-%s-%d", role, seq.Add(1))
	c.Metadata.AllowAutoTopicCreation = false
	c.Metadata.Retry.Max = 5
	c.Metadata.Retry.Backoff = 200 * time.Millisecond
	c.Net.DialTimeout = 10 * time.Second
	c.Net.ReadTimeout = 35 * time.Second
	c.Admin.Timeout = 30 * time.Second
	c.Admin.Retry.Max = 10
	c.Admin.Retry.Backoff = 200 * time.Millisecond
	if sasl != nil {
		c.Net.SASL.Enable = true
		c.Net.SASL.Handshake = true
		c.Net.SASL.User = sasl.Username
		c.Net.SASL.Password = sasl.Password
		switch sasl.Mechanism {
		case "PLAIN":
			c.Net.SASL.Mechanism = sarama.SASLTypePlaintext
		case "SCRAM-SHA-256":
			c.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA256
			c.Net.SASL.SCRAMClientGeneratorFunc = scramSHA256
		case "SCRAM-SHA-512":
			c.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA512
			c.Net.SASL.SCRAMClientGeneratorFunc = scramSHA512
		}
	}
	return c
}

func adm() (sarama.ClusterAdmin, error) {
	adminOnce.Do(func() {
		client, adminErr = sarama.NewClient([]string{bootstrap}, config("admin"))
		if adminErr == nil {
			admin, adminErr = sarama.NewClusterAdminFromClient(client)
		}
	})
	return admin, adminErr
}

func seconds(r rpc.Req, k string, dflt float64) time.Duration {
	f := r.Float(k)
	if !r.Has(k) || f <= 0 {
		f = dflt
	}
	return time.Duration(f * float64(time.Second))
}

func kerr(code sarama.KError, msg *string) error {
	if code == sarama.ErrNoError {
		return nil
	}
	if msg != nil && *msg != "" {
		return fmt.Errorf("%w: %s", code, *msg)
	}
	return code
}

var aclOps = map[int]string{2: "ALL", 3: "READ", 4: "WRITE", 5: "CREATE", 6: "DELETE", 7: "ALTER", 8: "DESCRIBE",
	9: "CLUSTER_ACTION", 10: "DESCRIBE_CONFIGS", 11: "ALTER_CONFIGS", 12: "IDEMPOTENT_WRITE", 13: "CREATE_TOKENS",
	14: "DESCRIBE_TOKENS", 15: "TWO_PHASE_COMMIT"}

func opsFromBits(bits int32) any {
	if bits == -2147483648 {
		return nil
	}
	out := []string{}
	for code, name := range aclOps {
		if bits&(1<<code) != 0 {
			out = append(out, name)
		}
	}
	return out
}

// --- topic admin -----------------------------------------------------------------------------------

func createTopic(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	configs := map[string]*string{}
	for k, v := range r.StrMap("configs") {
		configs[k] = &v
	}
	return nil, a.CreateTopic(r.Str("name"), &sarama.TopicDetail{NumPartitions: int32(r.Int("partitions")),
		ReplicationFactor: int16(r.Int("replication_factor")), ConfigEntries: configs}, false)
}

func deleteTopic(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	return nil, a.DeleteTopic(r.Str("name"))
}

func createPartitions(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	return nil, a.CreatePartitions(r.Str("name"), int32(r.Int("total")), nil, false)
}

func describeTopic(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	md, err := a.DescribeTopics([]string{r.Str("name")})
	if err != nil {
		return nil, err
	}
	for _, t := range md {
		if t.Name == r.Str("name") {
			if t.Err != sarama.ErrNoError {
				return nil, t.Err
			}
			return len(t.Partitions), nil
		}
	}
	return nil, sarama.ErrUnknownTopicOrPartition
}

func topicConfigs(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	entries, err := a.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: r.Str("name")})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range entries {
		out[e.Name] = e.Value
	}
	return out, nil
}

func deleteRecords(r rpc.Req) (any, error) {
	if _, err := adm(); err != nil {
		return nil, err
	}
	topic, p := r.Str("topic"), int32(r.Int("partition"))
	// ClusterAdmin.DeleteRecords keeps only the errors; the low watermark is in the leader's answer.
	leader, err := client.Leader(topic, p)
	if err != nil {
		return nil, err
	}
	req := &sarama.DeleteRecordsRequest{Version: 1, Timeout: 30 * time.Second, Topics: map[string]*sarama.DeleteRecordsRequestTopic{
		topic: {PartitionOffsets: map[int32]int64{p: r.Int("before")}}}}
	resp, err := leader.DeleteRecords(req)
	if err != nil {
		return nil, err
	}
	t, ok := resp.Topics[topic]
	if !ok || t.Partitions[p] == nil {
		return nil, fmt.Errorf("no answer for %s/%d", topic, p)
	}
	if t.Partitions[p].Err != sarama.ErrNoError {
		return nil, t.Partitions[p].Err
	}
	return t.Partitions[p].LowWatermark, nil
}

func metadata(rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	brokers, _, err := a.DescribeCluster()
	if err != nil {
		return nil, err
	}
	ids := []int32{}
	for _, b := range brokers {
		ids = append(ids, b.ID())
	}
	list, err := a.ListTopics()
	if err != nil {
		return nil, err
	}
	topics := map[string]int32{}
	for name, d := range list {
		topics[name] = d.NumPartitions
	}
	return map[string]any{"brokers": ids, "topics": topics}, nil
}

// --- produce ---------------------------------------------------------------------------------------

var codecs = map[string]sarama.CompressionCodec{
	"none": sarama.CompressionNone, "gzip": sarama.CompressionGZIP, "snappy": sarama.CompressionSnappy,
	"lz4": sarama.CompressionLZ4, "zstd": sarama.CompressionZSTD,
}

func producerConfig(r rpc.Req, msgs []rpc.Msg) *sarama.Config {
	c := config("producer")
	timeout := seconds(r, "timeout", 30)
	c.Producer.Return.Successes = true
	c.Producer.Return.Errors = true
	c.Producer.MaxMessageBytes = 16 << 20
	c.Producer.Timeout = max(timeout/2, time.Second)
	c.Producer.Retry.Max = 5
	c.Producer.Retry.Backoff = 200 * time.Millisecond
	c.Producer.Flush.Frequency = 5 * time.Millisecond
	if allExplicit(msgs) {
		c.Producer.Partitioner = sarama.NewManualPartitioner
	}
	return c
}

func allExplicit(msgs []rpc.Msg) bool {
	for _, m := range msgs {
		if m.Partition < 0 {
			return false
		}
	}
	return len(msgs) > 0
}

func messages(topic string, msgs []rpc.Msg) ([]*sarama.ProducerMessage, error) {
	explicit := allExplicit(msgs)
	out := make([]*sarama.ProducerMessage, 0, len(msgs))
	for _, m := range msgs {
		if !explicit && m.Partition >= 0 {
			return nil, rpc.Unsupported("records with and without a partition in one call")
		}
		pm := &sarama.ProducerMessage{Topic: topic}
		if m.Key != nil {
			pm.Key = sarama.ByteEncoder(m.Key)
		}
		if m.Value != nil {
			pm.Value = sarama.ByteEncoder(m.Value)
		}
		if explicit {
			pm.Partition = m.Partition
		}
		if m.Timestamp >= 0 {
			pm.Timestamp = time.UnixMilli(m.Timestamp)
		}
		for _, h := range m.Headers {
			pm.Headers = append(pm.Headers, sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
		}
		out = append(out, pm)
	}
	return out, nil
}

func produce(r rpc.Req) (any, error) {
	msgs := r.Msgs("msgs")
	c := producerConfig(r, msgs)
	switch r.Str("acks") {
	case "0":
		c.Producer.RequiredAcks = sarama.NoResponse
	case "1":
		c.Producer.RequiredAcks = sarama.WaitForLocal
	default:
		c.Producer.RequiredAcks = sarama.WaitForAll
	}
	if r.Bool("idempotent") {
		c.Producer.Idempotent = true
		c.Net.MaxOpenRequests = 1 // Sarama's idempotent producer requires it
	} else {
		c.Net.MaxOpenRequests = 1
	}
	if codec, ok := codecs[r.Str("compression")]; ok {
		c.Producer.Compression = codec
	}
	p, err := sarama.NewSyncProducer([]string{bootstrap}, c)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	pms, err := messages(r.Str("topic"), msgs)
	if err != nil {
		return nil, err
	}
	if err := p.SendMessages(pms); err != nil {
		return nil, err
	}
	out := make([]any, 0, len(pms))
	for _, pm := range pms {
		off := pm.Offset
		if r.Str("acks") == "0" {
			off = -1
		}
		out = append(out, rpc.Delivery(pm.Partition, off))
	}
	return out, nil
}

func txnProducer(r rpc.Req, msgs []rpc.Msg) (sarama.SyncProducer, error) {
	c := producerConfig(r, msgs)
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Idempotent = true
	c.Producer.Transaction.ID = r.Str("transactional_id")
	c.Producer.Transaction.Timeout = 60 * time.Second
	c.Net.MaxOpenRequests = 1
	return sarama.NewSyncProducer([]string{bootstrap}, c)
}

func produceTransactions(r rpc.Req) (any, error) {
	txns, _ := r["txns"].([]any)
	var all []rpc.Msg
	for _, t := range txns {
		all = append(all, rpc.Req(t.(map[string]any)).Msgs("msgs")...)
	}
	p, err := txnProducer(r, all)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	for _, t := range txns {
		txn := rpc.Req(t.(map[string]any))
		pms, err := messages(r.Str("topic"), txn.Msgs("msgs"))
		if err != nil {
			return nil, err
		}
		if err := p.BeginTxn(); err != nil {
			return nil, err
		}
		if err := p.SendMessages(pms); err != nil {
			_ = p.AbortTxn()
			return nil, err
		}
		if txn.Bool("commit") {
			err = p.CommitTxn()
		} else {
			err = p.AbortTxn()
		}
		if err != nil {
			return nil, err
		}
	}
	return nil, nil
}

func transactionalOffsets(r rpc.Req) (any, error) {
	msgs := r.Msgs("msgs")
	p, err := txnProducer(r, msgs)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	pms, err := messages(r.Str("topic"), msgs)
	if err != nil {
		return nil, err
	}
	if err := p.BeginTxn(); err != nil {
		return nil, err
	}
	if err := p.SendMessages(pms); err != nil {
		_ = p.AbortTxn()
		return nil, err
	}
	offsets := []*sarama.PartitionOffsetMetadata{}
	for part, o := range r.PartitionOffsets("offsets") {
		offsets = append(offsets, &sarama.PartitionOffsetMetadata{Partition: part, Offset: o})
	}
	if err := p.AddOffsetsToTxn(map[string][]*sarama.PartitionOffsetMetadata{r.Str("offsets_topic"): offsets},
		r.Str("group")); err != nil {
		_ = p.AbortTxn()
		return nil, err
	}
	if r.Bool("commit") {
		return nil, p.CommitTxn()
	}
	return nil, p.AbortTxn()
}

// --- consume ---------------------------------------------------------------------------------------

func recordOut(m *sarama.ConsumerMessage) map[string]any {
	hs := make([]rpc.Header, 0, len(m.Headers))
	for _, h := range m.Headers {
		hs = append(hs, rpc.Header{Key: string(h.Key), Value: h.Value})
	}
	return rpc.Record(m.Topic, m.Partition, m.Offset, m.Timestamp.UnixMilli(), m.Key, m.Value, hs)
}

func consumerConfig(isolation string) *sarama.Config {
	c := config("consumer")
	c.Consumer.Return.Errors = true
	c.Consumer.MaxWaitTime = 100 * time.Millisecond
	c.Consumer.Fetch.Default = 2000000
	c.Consumer.Fetch.Max = 16 << 20
	if isolation == "read_committed" {
		c.Consumer.IsolationLevel = sarama.ReadCommitted
	}
	return c
}

// consume assigns the partitions. Sarama's partition consumer has no auto.offset.reset: a start
// offset outside the log fails with OFFSET_OUT_OF_RANGE, and the application chooses where to go, as
// here (reset "earliest" or "latest"; "none" keeps the error).
func consume(r rpc.Req) (any, error) {
	topic := r.Str("topic")
	cons, err := sarama.NewConsumer([]string{bootstrap}, consumerConfig(r.Str("isolation")))
	if err != nil {
		return nil, err
	}
	defer cons.Close()
	start := int64(sarama.OffsetOldest)
	switch s := r["start"].(type) {
	case string:
		if s == "latest" {
			start = sarama.OffsetNewest
		}
	default:
		start = r.Int("start")
	}
	out := make(chan *sarama.ConsumerMessage, 1024)
	errs := make(chan error, 16)
	var pcs []sarama.PartitionConsumer
	defer func() {
		for _, pc := range pcs {
			pc.AsyncClose()
		}
	}()
	for _, p := range r.Ints("partitions") {
		pc, err := cons.ConsumePartition(topic, p, start)
		if errors.Is(err, sarama.ErrOffsetOutOfRange) && r.Str("reset") != "none" {
			reset := int64(sarama.OffsetOldest)
			if r.Str("reset") == "latest" {
				reset = sarama.OffsetNewest
			}
			pc, err = cons.ConsumePartition(topic, p, reset)
		}
		if err != nil {
			return nil, err
		}
		pcs = append(pcs, pc)
		go func() {
			for m := range pc.Messages() {
				out <- m
			}
		}()
		go func() {
			for e := range pc.Errors() {
				select {
				case errs <- e:
				default:
				}
			}
		}()
	}
	count := int(r.Int("count"))
	idle := r.Float("idle")
	got := []any{}
	deadline := time.After(seconds(r, "timeout", 20))
	last := time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for len(got) < count {
		select {
		case m := <-out:
			got = append(got, recordOut(m))
			last = time.Now()
		case e := <-errs:
			return got, e
		case <-tick.C:
			if idle > 0 && time.Since(last) > time.Duration(idle*float64(time.Second)) {
				return got, nil
			}
		case <-deadline:
			return got, nil
		}
	}
	return got, nil
}

func listOffset(r rpc.Req) (any, error) {
	if _, err := adm(); err != nil {
		return nil, err
	}
	ts := int64(sarama.OffsetOldest)
	switch s := r["spec"].(type) {
	case string:
		if s == "latest" {
			ts = sarama.OffsetNewest
		}
	default:
		ts = r.Int("spec")
	}
	return client.GetOffset(r.Str("topic"), int32(r.Int("partition")), ts)
}

// --- groups ----------------------------------------------------------------------------------------

type member struct {
	group  sarama.ConsumerGroup
	state  *rpc.MemberState
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

type handler struct {
	m          *member
	autoCommit bool
}

func (h *handler) Setup(s sarama.ConsumerGroupSession) error {
	h.m.state.SetAssignment(s.Claims())
	return nil
}

func (h *handler) Cleanup(sarama.ConsumerGroupSession) error {
	h.m.state.SetAssignment(nil)
	return nil
}

func (h *handler) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		h.m.state.Add(recordOut(msg))
		s.MarkMessage(msg, "")
		if !h.autoCommit {
			s.Commit()
		}
	}
	return nil
}

func fatal(err error) bool {
	var ke sarama.KError
	if errors.As(err, &ke) {
		switch ke {
		case sarama.ErrTopicAuthorizationFailed, sarama.ErrGroupAuthorizationFailed,
			sarama.ErrClusterAuthorizationFailed, sarama.ErrUnsupportedVersion, sarama.ErrInconsistentGroupProtocol,
			sarama.ErrInvalidSessionTimeout:
			return true
		}
	}
	return false
}

func startMember(r rpc.Req) (any, error) {
	if r.Str("protocol") != "classic" {
		return nil, rpc.Unsupported("group.protocol=consumer")
	}
	c := consumerConfig("read_uncommitted")
	switch r.Str("assignor") {
	case "roundrobin":
		c.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyRoundRobin()}
	case "range":
		c.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyRange()}
	default:
		return nil, rpc.Unsupported("assignor %s", r.Str("assignor"))
	}
	c.Consumer.Group.Session.Timeout = time.Duration(r.Int("session_timeout_ms")) * time.Millisecond
	c.Consumer.Group.Heartbeat.Interval = 500 * time.Millisecond
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	if r.Str("reset") == "latest" {
		c.Consumer.Offsets.Initial = sarama.OffsetNewest
	}
	c.Consumer.Offsets.AutoCommit.Enable = r.Bool("auto_commit")
	c.Consumer.Offsets.AutoCommit.Interval = 200 * time.Millisecond
	g, err := sarama.NewConsumerGroup([]string{bootstrap}, r.Str("group"), c)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{group: g, state: rpc.NewMemberState(), cancel: cancel, done: make(chan struct{})}
	h := &handler{m: m, autoCommit: r.Bool("auto_commit")}
	go func() {
		for e := range g.Errors() {
			m.state.Fail(rpc.ErrorText(e, classify), fatal(e))
		}
	}()
	go func() {
		defer close(m.done)
		for ctx.Err() == nil {
			// Consume returns at each rebalance; called again it rejoins.
			if err := g.Consume(ctx, r.Strs("topics"), h); err != nil && ctx.Err() == nil {
				m.state.Fail(rpc.ErrorText(err, classify), fatal(err))
				if errors.Is(err, sarama.ErrClosedConsumerGroup) {
					return
				}
				select {
				case <-ctx.Done():
				case <-time.After(500 * time.Millisecond):
				}
			}
		}
	}()
	return members.Put(m), nil
}

func (m *member) close() {
	m.once.Do(func() {
		m.cancel()
		select {
		case <-m.done:
		case <-time.After(30 * time.Second):
		}
		closed := make(chan error, 1)
		go func() { closed <- m.group.Close() }() // leaves the group
		select {
		case err := <-closed:
			if err != nil {
				m.state.Fail("close: "+err.Error(), false)
			}
		case <-time.After(30 * time.Second):
			m.state.Fail("close: the group did not close in 30s", false)
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

func commitOffsets(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	offsets := map[int32]sarama.OffsetAndMetadata{}
	for p, o := range r.PartitionOffsets("offsets") {
		offsets[p] = sarama.OffsetAndMetadata{Offset: o}
	}
	resp, err := a.AlterConsumerGroupOffsets(r.Str("group"), map[string]map[int32]sarama.OffsetAndMetadata{
		r.Str("topic"): offsets}, nil)
	if err != nil {
		return nil, err
	}
	for _, ps := range resp.Errors {
		for _, e := range ps {
			if e != sarama.ErrNoError {
				return nil, e
			}
		}
	}
	return nil, nil
}

func committedOffsets(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	topic := r.Str("topic")
	resp, err := a.ListConsumerGroupOffsets(r.Str("group"), map[string][]int32{topic: r.Ints("partitions")})
	if err != nil {
		return nil, err
	}
	if resp.Err != sarama.ErrNoError {
		return nil, resp.Err
	}
	out := map[string]int64{}
	for _, p := range r.Ints("partitions") {
		out[strconv.Itoa(int(p))] = -1
		if b := resp.GetBlock(topic, p); b != nil {
			if b.Err != sarama.ErrNoError {
				return nil, b.Err
			}
			if b.Offset >= 0 {
				out[strconv.Itoa(int(p))] = b.Offset
			}
		}
	}
	return out, nil
}

func listGroups(rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	gs, err := a.ListConsumerGroups()
	if err != nil {
		return nil, err
	}
	out := []string{}
	for g := range gs {
		out = append(out, g)
	}
	return out, nil
}

func describeGroup(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ds, err := a.DescribeConsumerGroups([]string{r.Str("group")})
	if err != nil {
		return nil, err
	}
	if len(ds) != 1 {
		return nil, fmt.Errorf("%d groups described", len(ds))
	}
	if ds[0].Err != sarama.ErrNoError {
		return nil, ds[0].Err
	}
	return map[string]any{"state": ds[0].State, "members": len(ds[0].Members)}, nil
}

func deleteGroup(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	return nil, a.DeleteConsumerGroup(r.Str("group"))
}

func deleteCommittedOffsets(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	for _, p := range r.Ints("partitions") {
		if err := a.DeleteConsumerGroupOffset(r.Str("group"), r.Str("topic"), p); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

// groupAuthorizedOperations: ClusterAdmin's DescribeConsumerGroups does not ask for them; the
// coordinator is asked with Sarama's DescribeGroupsRequest.
func groupAuthorizedOperations(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	b, err := a.Coordinator(r.Str("group"))
	if err != nil {
		return nil, err
	}
	resp, err := b.DescribeGroups(&sarama.DescribeGroupsRequest{Version: 3, Groups: []string{r.Str("group")},
		IncludeAuthorizedOperations: true})
	if err != nil {
		return nil, err
	}
	for _, g := range resp.Groups {
		if g.Err != sarama.ErrNoError {
			return nil, g.Err
		}
		return opsFromBits(g.AuthorizedOperations), nil
	}
	return nil, fmt.Errorf("group not described")
}

// --- transactions admin ----------------------------------------------------------------------------

func txnAdmin() (sarama.TransactionClusterAdmin, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	return a.(sarama.TransactionClusterAdmin), nil
}

func listTransactions(rpc.Req) (any, error) {
	a, err := txnAdmin()
	if err != nil {
		return nil, err
	}
	ts, err := a.ListTransactions(nil, nil, -1)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, t := range ts {
		out[t.TransactionalID] = t.TransactionState
	}
	return out, nil
}

func describeTransaction(r rpc.Req) (any, error) {
	a, err := txnAdmin()
	if err != nil {
		return nil, err
	}
	tid := r.Str("transactional_id")
	res, err := a.DescribeTransactions([]string{tid})
	if err != nil {
		return nil, err
	}
	t, ok := res[tid]
	if !ok {
		return nil, fmt.Errorf("%s not described", tid)
	}
	if t.ErrorCode != sarama.ErrNoError {
		return nil, t.ErrorCode
	}
	return t.TransactionState, nil
}

func describeProducers(r rpc.Req) (any, error) {
	a, err := txnAdmin()
	if err != nil {
		return nil, err
	}
	topic, p := r.Str("topic"), int32(r.Int("partition"))
	res, err := a.DescribeProducers(map[string][]int32{topic: {p}})
	if err != nil {
		return nil, err
	}
	d, ok := res[topic][p]
	if !ok {
		return nil, fmt.Errorf("partition not described")
	}
	if err := kerr(d.ErrorCode, d.ErrorMessage); err != nil {
		return nil, err
	}
	ids := []int64{}
	for _, s := range d.ActiveProducers {
		ids = append(ids, s.ProducerID)
	}
	return ids, nil
}

// --- configs ---------------------------------------------------------------------------------------

var resourceTypes = map[string]sarama.ConfigResourceType{"topic": sarama.TopicResource, "broker": sarama.BrokerResource}

var incrementalOps = map[string]sarama.IncrementalAlterConfigsOperation{
	"set": sarama.IncrementalAlterConfigsOperationSet, "delete": sarama.IncrementalAlterConfigsOperationDelete,
	"append": sarama.IncrementalAlterConfigsOperationAppend, "subtract": sarama.IncrementalAlterConfigsOperationSubtract,
}

// Sarama names config sources its own way ("Topic", ...); the protocol's number is Kafka's.
var sources = map[sarama.ConfigSource]string{0: "UNKNOWN", 1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG",
	3: "DYNAMIC_DEFAULT_BROKER_CONFIG", 4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG", 6: "DYNAMIC_BROKER_LOGGER_CONFIG",
	7: "CLIENT_METRICS_CONFIG", 8: "GROUP_CONFIG"}

func source(s sarama.ConfigSource) any {
	if n, ok := sources[s]; ok {
		return n
	}
	return int(s)
}

func resource(r rpc.Req) (sarama.ConfigResourceType, error) {
	t, ok := resourceTypes[r.Str("rtype")]
	if !ok {
		// Sarama's ConfigResourceType has no CLIENT_METRICS (16).
		return 0, rpc.Unsupported("%s config resources", r.Str("rtype"))
	}
	return t, nil
}

func alterConfigs(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	t, err := resource(r)
	if err != nil {
		return nil, err
	}
	if !r.Bool("incremental") {
		entries := map[string]*string{}
		for _, op := range r.ConfigOps("ops") {
			if op.Op != "set" {
				return nil, fmt.Errorf("AlterConfigs only sets configs")
			}
			entries[op.Key] = op.Value
		}
		return nil, a.AlterConfig(t, r.Str("name"), entries, r.Bool("validate_only"))
	}
	entries := map[string]sarama.IncrementalAlterConfigsEntry{}
	for _, op := range r.ConfigOps("ops") {
		o, ok := incrementalOps[op.Op]
		if !ok {
			return nil, fmt.Errorf("bad config op %s", op.Op)
		}
		if _, dup := entries[op.Key]; dup {
			return nil, rpc.Unsupported("two operations on one key in a request")
		}
		entries[op.Key] = sarama.IncrementalAlterConfigsEntry{Operation: o, Value: op.Value}
	}
	return nil, a.IncrementalAlterConfig(t, r.Str("name"), entries, r.Bool("validate_only"))
}

func describeConfigs(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	t, err := resource(r)
	if err != nil {
		return nil, err
	}
	res, err := a.DescribeConfigs([]*sarama.ConfigResource{{Type: t, Name: r.Str("name")}},
		sarama.DescribeConfigsOptions{IncludeSynonyms: r.Bool("synonyms")})
	if err != nil {
		return nil, err
	}
	out := map[string]any{}
	for _, rr := range res {
		if rr.ErrorCode != sarama.ErrNoError {
			return nil, kerr(rr.ErrorCode, &rr.ErrorMsg)
		}
		for _, e := range rr.Configs {
			syn := [][]any{}
			for _, s := range e.Synonyms {
				syn = append(syn, []any{s.ConfigName, s.ConfigValue, source(s.Source)})
			}
			out[e.Name] = map[string]any{"value": e.Value, "source": source(e.Source), "read_only": e.ReadOnly,
				"synonyms": syn}
		}
	}
	return out, nil
}

// --- cluster admin ---------------------------------------------------------------------------------

// describeCluster: ClusterAdmin's DescribeCluster reads Metadata and gives no cluster id; Sarama's
// DescribeClusterRequest goes to a broker.
func describeCluster(r rpc.Req) (any, error) {
	if _, err := adm(); err != nil {
		return nil, err
	}
	b := client.LeastLoadedBroker()
	if b == nil {
		return nil, fmt.Errorf("no broker")
	}
	req := sarama.NewDescribeClusterRequest(kafkaVersion)
	req.IncludeClusterAuthorizedOperations = r.Bool("authorized_operations")
	resp, err := b.DescribeCluster(req)
	if err != nil {
		return nil, err
	}
	if err := kerr(resp.Err, resp.ErrorMessage); err != nil {
		return nil, err
	}
	brokers := []int32{}
	for _, x := range resp.Brokers {
		brokers = append(brokers, x.BrokerID)
	}
	return map[string]any{"cluster_id": resp.ClusterID, "controller": resp.ControllerID, "brokers": brokers,
		"authorized_operations": opsFromBits(resp.ClusterAuthorizedOperations)}, nil
}

// topicAuthorizedOperations: Metadata v8+ with IncludeTopicAuthorizedOperations, as Sarama's request.
func topicAuthorizedOperations(r rpc.Req) (any, error) {
	if _, err := adm(); err != nil {
		return nil, err
	}
	b := client.LeastLoadedBroker()
	if b == nil {
		return nil, fmt.Errorf("no broker")
	}
	req := sarama.NewMetadataRequest(kafkaVersion, []string{r.Str("name")})
	req.AllowAutoTopicCreation = false
	req.IncludeTopicAuthorizedOperations = true
	resp, err := b.GetMetadata(req)
	if err != nil {
		return nil, err
	}
	for _, t := range resp.Topics {
		if t.Name == r.Str("name") {
			if t.Err != sarama.ErrNoError {
				return nil, t.Err
			}
			return opsFromBits(t.TopicAuthorizedOperations), nil
		}
	}
	return nil, sarama.ErrUnknownTopicOrPartition
}

func describeLogDirs(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	id := int32(r.Int("broker"))
	res, err := a.DescribeLogDirs([]int32{id})
	if err != nil {
		return nil, err
	}
	out := map[string]any{}
	for _, d := range res[id] {
		var e any
		if d.ErrorCode != sarama.ErrNoError {
			e = d.ErrorCode.Error()
		}
		replicas := []any{}
		for _, t := range d.Topics {
			for _, p := range t.Partitions {
				replicas = append(replicas, map[string]any{"topic": t.Topic, "partition": p.PartitionID,
					"size": p.Size, "future": p.IsTemporary})
			}
		}
		out[d.Path] = map[string]any{"error": e, "replicas": replicas}
	}
	return out, nil
}

func electLeaders(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	topic := r.Str("topic")
	res, err := a.ElectLeaders(sarama.PreferredElection, map[string][]int32{topic: r.Ints("partitions")})
	if err != nil {
		return nil, err
	}
	out := map[string]any{}
	for p, x := range res[topic] {
		if x.ErrorCode == sarama.ErrNoError {
			out[strconv.Itoa(int(p))] = nil
		} else {
			out[strconv.Itoa(int(p))] = kafkaName(x.ErrorCode)
		}
	}
	return out, nil
}

var partitionPrefix = regexp.MustCompile(`^\[.*-(\d+)\]: `)

// alterReassignments: ClusterAdmin.AlterPartitionReassignments takes a list whose index is the
// partition, so it can only address partitions 0..n-1 together, each with a replica list.
func alterReassignments(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	targets := r.Targets("targets")
	assignment := make([][]int32, len(targets))
	for p, replicas := range targets {
		if int(p) >= len(targets) {
			return nil, rpc.Unsupported("reassigning partition %d without the partitions before it", p)
		}
		if replicas == nil {
			return nil, rpc.Unsupported("cancelling a partition reassignment")
		}
		assignment[p] = replicas
	}
	out := map[string]any{}
	for p := range targets {
		out[strconv.Itoa(int(p))] = nil
	}
	err = a.AlterPartitionReassignments(r.Str("topic"), assignment)
	if err == nil {
		return out, nil
	}
	// Per partition: "[topic-p]: <error>" joined under ErrReassignPartitions.
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) {
		return nil, err
	}
	for _, e := range joined.Unwrap() {
		m := partitionPrefix.FindStringSubmatch(e.Error())
		var ke sarama.KError
		if m == nil || !errors.As(e, &ke) {
			return nil, err
		}
		out[m[1]] = kafkaName(ke)
	}
	return out, nil
}

func listReassignments(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	res, err := a.ListPartitionReassignments(r.Str("topic"), r.Ints("partitions"))
	if err != nil {
		return nil, err
	}
	out := map[string]any{}
	for p, s := range res[r.Str("topic")] {
		out[strconv.Itoa(int(p))] = map[string]any{"replicas": s.Replicas, "adding": s.AddingReplicas,
			"removing": s.RemovingReplicas}
	}
	return out, nil
}

func describeClientQuotas(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	var comps []sarama.QuotaFilterComponent
	for k, v := range r.StrMap("entity") {
		comps = append(comps, sarama.QuotaFilterComponent{EntityType: sarama.QuotaEntityType(k),
			MatchType: sarama.QuotaMatchExact, Match: v})
	}
	res, err := a.DescribeClientQuotas(comps, true)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, e := range res {
		for k, v := range e.Values {
			out[k] = v
		}
	}
	return out, nil
}

// alterClientQuotas: ClusterAdmin.AlterClientQuotas sends one quota key per request and reports an
// entry's error by its message alone; Sarama's AlterClientQuotasRequest goes to the controller with all
// of them and keeps the code.
func alterClientQuotas(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	entry := sarama.AlterClientQuotasEntry{}
	for k, v := range r.StrMap("entity") {
		entry.Entity = append(entry.Entity, sarama.QuotaEntityComponent{EntityType: sarama.QuotaEntityType(k),
			MatchType: sarama.QuotaMatchExact, Name: v})
	}
	for k, v := range r.Quotas("quotas") {
		op := sarama.ClientQuotasOp{Key: k, Remove: v == nil}
		if v != nil {
			op.Value = *v
		}
		entry.Ops = append(entry.Ops, op)
	}
	b, err := a.Controller()
	if err != nil {
		return nil, err
	}
	resp, err := b.AlterClientQuotas(&sarama.AlterClientQuotasRequest{Version: 1,
		Entries: []sarama.AlterClientQuotasEntry{entry}, ValidateOnly: r.Bool("validate_only")})
	if err != nil {
		return nil, err
	}
	for _, e := range resp.Entries {
		if err := kerr(e.ErrorCode, e.ErrorMsg); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

func kafkaName(e sarama.KError) string { return rpc.ErrorName(int16(e)) }
