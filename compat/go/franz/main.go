// franz-go (github.com/twmb/franz-go: kgo, and kadm for administration) driven by the compatibility
// suite. One long-lived process per test worker speaking compat/go/rpc's JSON lines. Where kadm has no
// call for an API (DescribeCluster, DescribeTopicPartitions, DescribeConfigs with or without synonyms,
// CLIENT_METRICS resources, ListOffsets by timestamp as the broker answers it) the driver sends the
// request through kgo's Client.Request with franz-go's own kmsg types.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"compat/go/rpc"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

const version = "franz-go v1.22.3, kadm v1.20.0"

var (
	bootstrap string
	sasl      *rpc.Sasl
	seq       atomic.Int64
	adminOnce sync.Once
	adminCl   *kgo.Client
	admin     *kadm.Client
	adminErr  error
	members   rpc.Members[*member]
)

func classify(err error) int16 {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return ke.Code
	}
	if errors.Is(err, kgo.ErrRecordTimeout) {
		return rpc.RequestTimedOut
	}
	return -1
}

func main() {
	bootstrap, sasl = rpc.Args()
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
		"describe_topic_detail":       describeTopicDetail,
		"topic_authorized_operations": topicAuthorizedOperations,
		"group_authorized_operations": groupAuthorizedOperations,
		"describe_log_dirs":           describeLogDirs,
		"alter_replica_log_dir":       alterReplicaLogDir,
		"elect_leaders":               electLeaders,
		"alter_reassignments":         alterReassignments,
		"list_reassignments":          listReassignments,
		"describe_client_quotas":      describeClientQuotas,
		"alter_client_quotas":         alterClientQuotas,
		"max_timestamp_offset":        maxTimestampOffset,
		"consume_validated":           consumeValidated,
		"push_telemetry":              pushTelemetry,
	}
	rpc.Serve(version, ops, classify, func() {
		for _, m := range members.All() {
			m.close()
		}
		if adminCl != nil {
			adminCl.Close()
		}
	})
}

// --- clients ---------------------------------------------------------------------------------------

func baseOpts(role string) []kgo.Opt {
	opts := []kgo.Opt{
		kgo.SeedBrokers(bootstrap),
		kgo.ClientID(fmt.Sprintf("compat-franz-go-%s-%d", role, seq.Add(1))),
		kgo.RetryTimeout(30 * time.Second),
	}
	if os.Getenv("COMPAT_FRANZ_LOG") != "" {
		opts = append(opts, kgo.WithLogger(kgo.BasicLogger(os.Stderr, kgo.LogLevelDebug, nil)))
	}
	if sasl != nil {
		switch sasl.Mechanism {
		case "PLAIN":
			opts = append(opts, kgo.SASL(plain.Auth{User: sasl.Username, Pass: sasl.Password}.AsMechanism()))
		case "SCRAM-SHA-256":
			opts = append(opts, kgo.SASL(scram.Auth{User: sasl.Username, Pass: sasl.Password}.AsSha256Mechanism()))
		case "SCRAM-SHA-512":
			opts = append(opts, kgo.SASL(scram.Auth{User: sasl.Username, Pass: sasl.Password}.AsSha512Mechanism()))
		}
	}
	return opts
}

func adm() (*kadm.Client, error) {
	adminOnce.Do(func() {
		adminCl, adminErr = kgo.NewClient(baseOpts("admin")...)
		if adminErr == nil {
			admin = kadm.NewClient(adminCl)
			admin.SetTimeoutMillis(30000)
		}
	})
	return admin, adminErr
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

// withMessage keeps the broker's error message next to its error.
func withMessage(err error, msg string) error {
	if err == nil || msg == "" {
		return err
	}
	return fmt.Errorf("%w: %s", err, msg)
}

func errCode(code int16, msg *string) error {
	if code == 0 {
		return nil
	}
	m := ""
	if msg != nil {
		m = *msg
	}
	return withMessage(kerr.ErrorForCode(code), m)
}

var aclOps = map[int]string{2: "ALL", 3: "READ", 4: "WRITE", 5: "CREATE", 6: "DELETE", 7: "ALTER", 8: "DESCRIBE",
	9: "CLUSTER_ACTION", 10: "DESCRIBE_CONFIGS", 11: "ALTER_CONFIGS", 12: "IDEMPOTENT_WRITE", 13: "CREATE_TOKENS",
	14: "DESCRIBE_TOKENS", 15: "TWO_PHASE_COMMIT"}

// opsFromBits: nil where the broker did not say (-2147483648).
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
	ctx, cancel := ctx30()
	defer cancel()
	configs := map[string]*string{}
	for k, v := range r.StrMap("configs") {
		configs[k] = &v
	}
	res, err := a.CreateTopic(ctx, int32(r.Int("partitions")), int16(r.Int("replication_factor")), configs, r.Str("name"))
	if err != nil {
		return nil, err
	}
	return nil, withMessage(res.Err, res.ErrMessage)
}

func deleteTopic(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	res, err := a.DeleteTopic(ctx, r.Str("name"))
	if err != nil {
		return nil, err
	}
	return nil, withMessage(res.Err, res.ErrMessage)
}

func createPartitions(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	res, err := a.UpdatePartitions(ctx, int(r.Int("total")), r.Str("name"))
	if err != nil {
		return nil, err
	}
	one, err := res.On(r.Str("name"), nil)
	if err != nil {
		return nil, err
	}
	return nil, withMessage(one.Err, one.ErrMessage)
}

func describeTopic(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	tds, err := a.ListTopics(ctx, r.Str("name"))
	if err != nil {
		return nil, err
	}
	td, ok := tds[r.Str("name")]
	if !ok {
		return nil, kerr.UnknownTopicOrPartition
	}
	if td.Err != nil {
		return nil, td.Err
	}
	return len(td.Partitions), nil
}

func topicConfigs(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	rcs, err := a.DescribeTopicConfigs(ctx, r.Str("name"))
	if err != nil {
		return nil, err
	}
	rc, err := rcs.On(r.Str("name"), nil)
	if err != nil {
		return nil, err
	}
	if rc.Err != nil {
		return nil, withMessage(rc.Err, rc.ErrMessage)
	}
	out := map[string]any{}
	for _, c := range rc.Configs {
		if c.Value == nil {
			out[c.Key] = nil
		} else {
			out[c.Key] = *c.Value
		}
	}
	return out, nil
}

func deleteRecords(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	var os kadm.Offsets
	os.Add(kadm.Offset{Topic: r.Str("topic"), Partition: int32(r.Int("partition")), At: r.Int("before"), LeaderEpoch: -1})
	res, err := a.DeleteRecords(ctx, os)
	if err != nil {
		return nil, err
	}
	one, ok := res.Lookup(r.Str("topic"), int32(r.Int("partition")))
	if !ok {
		return nil, fmt.Errorf("no answer for the partition")
	}
	if one.Err != nil {
		return nil, one.Err
	}
	return one.LowWatermark, nil
}

func metadata(rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	md, err := a.Metadata(ctx)
	if err != nil {
		return nil, err
	}
	brokers := []int32{}
	for _, b := range md.Brokers {
		brokers = append(brokers, b.NodeID)
	}
	topics := map[string]int{}
	for name, td := range md.Topics {
		if td.Err == nil {
			topics[name] = len(td.Partitions)
		}
	}
	return map[string]any{"brokers": brokers, "topics": topics, "cluster_id": md.Cluster}, nil
}

// --- produce ---------------------------------------------------------------------------------------

var codecs = map[string]kgo.CompressionCodec{
	"none": kgo.NoCompression(), "gzip": kgo.GzipCompression(), "snappy": kgo.SnappyCompression(),
	"lz4": kgo.Lz4Compression(), "zstd": kgo.ZstdCompression(),
}

func producerOpts(r rpc.Req, msgs []rpc.Msg) []kgo.Opt {
	timeout := seconds(r, "timeout", 30)
	opts := append(baseOpts("producer"),
		kgo.ProducerLinger(5*time.Millisecond),
		kgo.ProducerBatchMaxBytes(16<<20),
		kgo.ProduceRequestTimeout(max(timeout/2, time.Second)),
	)
	// franz-go counts a record's delivery timeout from the record's own timestamp, so a record stamped
	// further in the past than the timeout fails at once, unsent: with timestamps of their own the
	// records are bounded by the call's context only.
	if !anyTimestamp(msgs) {
		opts = append(opts, kgo.RecordDeliveryTimeout(timeout))
	}
	if allExplicit(msgs) {
		opts = append(opts, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	}
	return opts
}

func anyTimestamp(msgs []rpc.Msg) bool {
	for _, m := range msgs {
		if m.Timestamp >= 0 {
			return true
		}
	}
	return false
}

func allExplicit(msgs []rpc.Msg) bool {
	for _, m := range msgs {
		if m.Partition < 0 {
			return false
		}
	}
	return len(msgs) > 0
}

func records(topic string, msgs []rpc.Msg) ([]*kgo.Record, error) {
	explicit := allExplicit(msgs)
	out := make([]*kgo.Record, 0, len(msgs))
	for _, m := range msgs {
		if !explicit && m.Partition >= 0 {
			return nil, rpc.Unsupported("records with and without a partition in one call")
		}
		rec := &kgo.Record{Topic: topic, Key: m.Key, Value: m.Value}
		if explicit {
			rec.Partition = m.Partition
		}
		if m.Timestamp >= 0 {
			rec.Timestamp = time.UnixMilli(m.Timestamp)
		}
		for _, h := range m.Headers {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		out = append(out, rec)
	}
	return out, nil
}

func produce(r rpc.Req) (any, error) {
	msgs := r.Msgs("msgs")
	opts := producerOpts(r, msgs)
	acks := r.Str("acks")
	switch acks {
	case "0":
		opts = append(opts, kgo.RequiredAcks(kgo.NoAck()))
	case "1":
		opts = append(opts, kgo.RequiredAcks(kgo.LeaderAck()))
	default:
		opts = append(opts, kgo.RequiredAcks(kgo.AllISRAcks()))
	}
	if !r.Bool("idempotent") {
		opts = append(opts, kgo.DisableIdempotentWrite())
	} else if acks != "all" {
		return nil, fmt.Errorf("the idempotent producer needs acks=all")
	}
	if c, ok := codecs[r.Str("compression")]; ok {
		opts = append(opts, kgo.ProducerBatchCompression(c))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	recs, err := records(r.Str("topic"), msgs)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), seconds(r, "timeout", 30)+10*time.Second)
	defer cancel()
	res := cl.ProduceSync(ctx, recs...)
	if err := res.FirstErr(); err != nil {
		return nil, err
	}
	out := make([]any, 0, len(res))
	for _, pr := range res {
		off := pr.Record.Offset
		if acks == "0" {
			off = -1
		}
		out = append(out, rpc.Delivery(pr.Record.Partition, off))
	}
	return out, nil
}

func txnOpts(r rpc.Req, msgs []rpc.Msg) []kgo.Opt {
	return append(producerOpts(r, msgs), kgo.TransactionalID(r.Str("transactional_id")),
		kgo.TransactionTimeout(60*time.Second))
}

func produceTransactions(r rpc.Req) (any, error) {
	txns, _ := r["txns"].([]any)
	var all []rpc.Msg
	for _, t := range txns {
		all = append(all, rpc.Req(t.(map[string]any)).Msgs("msgs")...)
	}
	cl, err := kgo.NewClient(txnOpts(r, all)...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), seconds(r, "timeout", 60))
	defer cancel()
	for _, t := range txns {
		txn := rpc.Req(t.(map[string]any))
		recs, err := records(r.Str("topic"), txn.Msgs("msgs"))
		if err != nil {
			return nil, err
		}
		if err := cl.BeginTransaction(); err != nil {
			return nil, err
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			_ = cl.AbortBufferedRecords(ctx)
			_ = cl.EndTransaction(ctx, kgo.TryAbort)
			return nil, err
		}
		end := kgo.TryAbort
		if txn.Bool("commit") {
			end = kgo.TryCommit
		}
		if err := cl.EndTransaction(ctx, end); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

// transactionalOffsets: franz-go sends offsets to a transaction only for what a GroupTransactSession
// consumed as a member of the group, so the session joins the group, consumes the offsets topic
// record by record up to the wanted offsets and ends the transaction with them.
func transactionalOffsets(r rpc.Req) (any, error) {
	msgs := r.Msgs("msgs")
	want := r.PartitionOffsets("offsets")
	src := r.Str("offsets_topic")
	opts := append(txnOpts(r, msgs),
		kgo.ConsumerGroup(r.Str("group")), kgo.ConsumeTopics(src),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.SessionTimeout(10*time.Second),
		kgo.HeartbeatInterval(500*time.Millisecond))
	s, err := kgo.NewGroupTransactSession(opts...)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), seconds(r, "timeout", 60))
	defer cancel()
	pos := map[int32]int64{}
	done := func() bool {
		for p, o := range want {
			if pos[p] < o {
				return false
			}
		}
		return true
	}
	for !done() {
		fs := s.PollRecords(ctx, 1)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("consumed %v of %s, wanted %v: %w", pos, src, want, err)
		}
		for _, fe := range fs.Errors() {
			return nil, fe.Err
		}
		for _, rec := range fs.Records() {
			if o, ok := want[rec.Partition]; !ok || rec.Offset >= o {
				return nil, rpc.Unsupported("offsets other than those of the records the session consumed")
			}
			pos[rec.Partition] = rec.Offset + 1
		}
	}
	if err := s.Begin(); err != nil {
		return nil, err
	}
	recs, err := records(r.Str("topic"), msgs)
	if err != nil {
		return nil, err
	}
	if err := s.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		_, _ = s.End(ctx, kgo.TryAbort)
		return nil, err
	}
	end := kgo.TryAbort
	if r.Bool("commit") {
		end = kgo.TryCommit
	}
	committed, err := s.End(ctx, end)
	if err != nil {
		return nil, err
	}
	if r.Bool("commit") && !committed {
		return nil, fmt.Errorf("the session aborted the transaction instead of committing it")
	}
	return nil, nil
}

// --- consume ---------------------------------------------------------------------------------------

func recordOut(rec *kgo.Record) map[string]any {
	hs := make([]rpc.Header, 0, len(rec.Headers))
	for _, h := range rec.Headers {
		hs = append(hs, rpc.Header{Key: h.Key, Value: h.Value})
	}
	return rpc.Record(rec.Topic, rec.Partition, rec.Offset, rec.Timestamp.UnixMilli(), rec.Key, rec.Value, hs)
}

func resetOffset(reset string) kgo.Offset {
	switch reset {
	case "latest":
		return kgo.NewOffset().AtEnd()
	case "none":
		return kgo.NoResetOffset()
	}
	return kgo.NewOffset().AtStart()
}

func consumerOpts() []kgo.Opt {
	return append(baseOpts("consumer"), kgo.FetchMaxWait(100*time.Millisecond), kgo.FetchMaxPartitionBytes(2000000))
}

// pollUntil collects records until count, the timeout, or idle seconds without any.
func pollUntil(cl *kgo.Client, count int, timeout time.Duration, idle float64) ([]any, error) {
	out := []any{}
	deadline := time.Now().Add(timeout)
	last := time.Now()
	for len(out) < count && time.Now().Before(deadline) {
		if idle > 0 && time.Since(last) > time.Duration(idle*float64(time.Second)) {
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		fs := cl.PollRecords(ctx, count-len(out))
		cancel()
		for _, fe := range fs.Errors() {
			if errors.Is(fe.Err, context.DeadlineExceeded) || errors.Is(fe.Err, context.Canceled) {
				continue
			}
			return out, fe.Err
		}
		for _, rec := range fs.Records() {
			out = append(out, recordOut(rec))
			last = time.Now()
		}
	}
	return out, nil
}

func consume(r rpc.Req) (any, error) {
	topic := r.Str("topic")
	var start kgo.Offset
	switch s := r["start"].(type) {
	case string:
		if s == "latest" {
			start = kgo.NewOffset().AtEnd()
		} else {
			start = kgo.NewOffset().AtStart()
		}
	default:
		start = kgo.NewOffset().At(r.Int("start"))
	}
	parts := map[int32]kgo.Offset{}
	for _, p := range r.Ints("partitions") {
		parts[p] = start
	}
	opts := append(consumerOpts(), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts}),
		kgo.ConsumeResetOffset(resetOffset(r.Str("reset"))))
	if r.Str("isolation") == "read_committed" {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	return pollUntil(cl, int(r.Int("count")), seconds(r, "timeout", 20), r.Float("idle"))
}

func consumeValidated(r rpc.Req) (any, error) {
	topic, p, offset := r.Str("topic"), int32(r.Int("partition")), r.Int("offset")
	timeout := seconds(r, "timeout", 30)
	first, err := kgo.NewClient(append(consumerOpts(), kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {p: kgo.NewOffset().At(offset)}}))...)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	fs := first.PollRecords(ctx, 1)
	first.Close()
	if err := fs.Err0(); err != nil {
		return nil, err
	}
	recs := fs.Records()
	if len(recs) == 0 || recs[0].Offset != offset {
		return nil, fmt.Errorf("no record at offset %d", offset)
	}
	epoch := recs[0].LeaderEpoch
	if epoch < 0 {
		return nil, fmt.Errorf("the record at %d carries no leader epoch", offset)
	}
	// An offset with its epoch is validated with OffsetForLeaderEpoch before the client fetches from it.
	cl, err := kgo.NewClient(append(consumerOpts(), kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {p: kgo.NewOffset().At(offset).WithEpoch(epoch)}}))...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	return pollUntil(cl, int(r.Int("count")), timeout, 0)
}

// listOffset: ListOffsets as the broker answers it (kadm's by-time lookup substitutes the end offset
// where the broker answers -1).
func listOffset(r rpc.Req) (any, error) {
	if _, err := adm(); err != nil {
		return nil, err
	}
	ts := int64(-2)
	switch s := r["spec"].(type) {
	case string:
		if s == "latest" {
			ts = -1
		}
	default:
		ts = r.Int("spec")
	}
	res, err := listOffsetsAt(r.Str("topic"), int32(r.Int("partition")), ts)
	if err != nil {
		return nil, err
	}
	return res[0], nil
}

func listOffsetsAt(topic string, partition int32, ts int64) ([]int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewListOffsetsRequestTopicPartition()
	rp.Partition = partition
	rp.Timestamp = ts
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	ctx, cancel := ctx30()
	defer cancel()
	resp, err := req.RequestWith(ctx, adminCl)
	if err != nil {
		return nil, err
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.Partition == partition {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					return nil, err
				}
				return []int64{p.Offset, p.Timestamp}, nil
			}
		}
	}
	return nil, fmt.Errorf("no answer for %s/%d", topic, partition)
}

func maxTimestampOffset(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	res, err := a.ListMaxTimestampOffsets(ctx, r.Str("topic"))
	if err != nil {
		return nil, err
	}
	lo, ok := res.Lookup(r.Str("topic"), int32(r.Int("partition")))
	if !ok {
		return nil, fmt.Errorf("no answer for the partition")
	}
	if lo.Err != nil {
		return nil, lo.Err
	}
	return []int64{lo.Offset, lo.Timestamp}, nil
}

// --- groups ----------------------------------------------------------------------------------------

type member struct {
	cl    *kgo.Client
	state *rpc.MemberState
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
}

func fatal(err error) bool {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return !ke.Retriable
	}
	return false
}

func startMember(r rpc.Req) (any, error) {
	st := rpc.NewMemberState()
	opts := append(consumerOpts(), kgo.ConsumerGroup(r.Str("group")), kgo.ConsumeTopics(r.Strs("topics")...),
		kgo.ConsumeResetOffset(resetOffset(r.Str("reset"))),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
			for t, ps := range a {
				st.Assign(t, ps)
			}
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
			for t, ps := range a {
				st.Revoke(t, ps)
			}
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
			for t, ps := range a {
				st.Revoke(t, ps)
			}
		}))
	switch r.Str("protocol") {
	case "consumer":
		// KIP-848: the coordinator assigns; franz-go takes it with the range or sticky balancer named.
		opts = append(opts, kgo.ServerSideBalancer(), kgo.Balancers(kgo.RangeBalancer()))
	default:
		switch r.Str("assignor") {
		case "range":
			opts = append(opts, kgo.Balancers(kgo.RangeBalancer()))
		case "roundrobin":
			opts = append(opts, kgo.Balancers(kgo.RoundRobinBalancer()))
		default:
			return nil, rpc.Unsupported("assignor %s", r.Str("assignor"))
		}
		opts = append(opts, kgo.SessionTimeout(time.Duration(r.Int("session_timeout_ms"))*time.Millisecond),
			kgo.HeartbeatInterval(500*time.Millisecond))
	}
	autoCommit := r.Bool("auto_commit")
	if autoCommit {
		opts = append(opts, kgo.AutoCommitInterval(200*time.Millisecond))
	} else {
		opts = append(opts, kgo.DisableAutoCommit())
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	m := &member{cl: cl, state: st, stop: make(chan struct{}), done: make(chan struct{})}
	go m.run(autoCommit)
	return members.Put(m), nil
}

func (m *member) run(autoCommit bool) {
	defer close(m.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-m.stop
		cancel()
	}()
	for {
		fs := m.cl.PollFetches(ctx)
		if ctx.Err() != nil || fs.IsClientClosed() {
			return
		}
		for _, fe := range fs.Errors() {
			m.state.Fail(fmt.Sprintf("%s[%d]: %v", fe.Topic, fe.Partition, fe.Err), fatal(fe.Err))
		}
		recs := fs.Records()
		for _, rec := range recs {
			m.state.Add(recordOut(rec))
		}
		if !autoCommit && len(recs) > 0 {
			if err := m.cl.CommitRecords(ctx, recs...); err != nil && ctx.Err() == nil {
				m.state.Fail("commit: "+err.Error(), fatal(err))
			}
		}
	}
}

func (m *member) close() {
	m.once.Do(func() {
		close(m.stop)
		select {
		case <-m.done:
		case <-time.After(30 * time.Second):
		}
		closed := make(chan struct{})
		go func() {
			m.cl.Close() // leaves the group (and commits what it polled, with autocommit)
			close(closed)
		}()
		select {
		case <-closed:
		case <-time.After(30 * time.Second):
			m.state.Fail("close: the client did not close in 30s", false)
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
	ctx, cancel := ctx30()
	defer cancel()
	var os kadm.Offsets
	for p, o := range r.PartitionOffsets("offsets") {
		os.Add(kadm.Offset{Topic: r.Str("topic"), Partition: p, At: o, LeaderEpoch: -1})
	}
	return nil, a.CommitAllOffsets(ctx, r.Str("group"), os)
}

func committedOffsets(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	res, err := a.FetchOffsets(ctx, r.Str("group"))
	if err != nil {
		return nil, err
	}
	if err := res.Error(); err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, p := range r.Ints("partitions") {
		out[fmt.Sprint(p)] = -1
		if o, ok := res.Lookup(r.Str("topic"), p); ok && o.At >= 0 {
			out[fmt.Sprint(p)] = o.At
		}
	}
	return out, nil
}

func listGroups(rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	gs, err := a.ListGroups(ctx)
	if err != nil {
		return nil, err
	}
	return gs.Groups(), nil
}

// describeGroup asks ConsumerGroupDescribe first, as the Java admin does, and DescribeGroups for a
// classic group (GROUP_ID_NOT_FOUND) or a broker without KIP-848.
func describeGroup(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	g := r.Str("group")
	// A broker without ConsumerGroupDescribe fails the whole call: then DescribeGroups answers.
	if cgs, err := a.DescribeConsumerGroups(ctx, g); err == nil {
		if d, ok := cgs[g]; ok && d.Err == nil {
			return map[string]any{"state": d.State, "members": len(d.Members)}, nil
		} else if ok && !errors.Is(d.Err, kerr.GroupIDNotFound) && !errors.Is(d.Err, kerr.UnsupportedVersion) {
			return nil, d.Err
		}
	}
	gs, err := a.DescribeGroups(ctx, g)
	if err != nil {
		return nil, err
	}
	d, ok := gs[g]
	if !ok {
		return nil, fmt.Errorf("group %s not described", g)
	}
	if d.Err != nil {
		return nil, withMessage(d.Err, d.ErrMessage)
	}
	return map[string]any{"state": d.State, "members": len(d.Members)}, nil
}

func deleteGroup(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	res, err := a.DeleteGroup(ctx, r.Str("group"))
	if err != nil {
		return nil, err
	}
	return nil, res.Err
}

func deleteCommittedOffsets(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	s := kadm.TopicsSet{}
	s.Add(r.Str("topic"), r.Ints("partitions")...)
	res, err := a.DeleteOffsets(ctx, r.Str("group"), s)
	if err != nil {
		return nil, err
	}
	return nil, res.Error()
}

func groupAuthorizedOperations(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	g := r.Str("group")
	gs, err := a.DescribeGroups(ctx, g) // kadm always asks for the authorized operations
	if err != nil {
		return nil, err
	}
	d := gs[g]
	if d.Err != nil {
		return nil, d.Err
	}
	if d.AuthorizedOperations == nil {
		return nil, nil
	}
	out := []string{}
	for _, op := range d.AuthorizedOperations {
		out = append(out, op.String())
	}
	return out, nil
}

// --- transactions admin ----------------------------------------------------------------------------

func listTransactions(rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	res, err := a.ListTransactions(ctx, nil, nil)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for id, t := range res {
		out[id] = t.State
	}
	return out, nil
}

func describeTransaction(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	tid := r.Str("transactional_id")
	res, err := a.DescribeTransactions(ctx, tid)
	if err != nil {
		return nil, err
	}
	d, ok := res[tid]
	if !ok {
		return nil, fmt.Errorf("%s not described", tid)
	}
	if d.Err != nil {
		return nil, d.Err
	}
	return d.State, nil
}

func describeProducers(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	s := kadm.TopicsSet{}
	s.Add(r.Str("topic"), int32(r.Int("partition")))
	res, err := a.DescribeProducers(ctx, s)
	if err != nil {
		return nil, err
	}
	d, ok := res[r.Str("topic")].Partitions[int32(r.Int("partition"))]
	if !ok {
		return nil, fmt.Errorf("partition not described")
	}
	if d.Err != nil {
		return nil, d.Err
	}
	ids := []int64{}
	for _, p := range d.ActiveProducers {
		ids = append(ids, p.ProducerID)
	}
	return ids, nil
}

// --- configs ---------------------------------------------------------------------------------------

var resourceTypes = map[string]kmsg.ConfigResourceType{
	"topic": kmsg.ConfigResourceTypeTopic, "broker": kmsg.ConfigResourceTypeBroker,
	"client_metrics": kmsg.ConfigResourceTypeClientMetrics,
}

var incrementalOps = map[string]kadm.IncrementalOp{
	"set": kadm.SetConfig, "delete": kadm.DeleteConfig, "append": kadm.AppendConfig, "subtract": kadm.SubtractConfig,
}

func alterConfigs(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	rtype, name, validate := r.Str("rtype"), r.Str("name"), r.Bool("validate_only")
	if rtype == "client_metrics" {
		return nil, alterClientMetrics(ctx, name, r.ConfigOps("ops"), r.Bool("incremental"), validate)
	}
	var cfgs []kadm.AlterConfig
	for _, op := range r.ConfigOps("ops") {
		o, ok := incrementalOps[op.Op]
		if !ok || (!r.Bool("incremental") && op.Op != "set") {
			return nil, fmt.Errorf("bad config op %s", op.Op)
		}
		cfgs = append(cfgs, kadm.AlterConfig{Op: o, Name: op.Key, Value: op.Value})
	}
	var res kadm.AlterConfigsResponses
	switch {
	case rtype == "topic" && r.Bool("incremental") && validate:
		res, err = a.ValidateAlterTopicConfigs(ctx, cfgs, name)
	case rtype == "topic" && r.Bool("incremental"):
		res, err = a.AlterTopicConfigs(ctx, cfgs, name)
	case rtype == "topic" && validate:
		res, err = a.ValidateAlterTopicConfigsState(ctx, cfgs, name)
	case rtype == "topic":
		res, err = a.AlterTopicConfigsState(ctx, cfgs, name)
	case rtype == "broker":
		// No broker id: the cluster-wide default (resource name "").
		var ids []int32
		if name != "" {
			var id int32
			if _, err := fmt.Sscan(name, &id); err != nil {
				return nil, err
			}
			ids = []int32{id}
		}
		switch {
		case r.Bool("incremental") && validate:
			res, err = a.ValidateAlterBrokerConfigs(ctx, cfgs, ids...)
		case r.Bool("incremental"):
			res, err = a.AlterBrokerConfigs(ctx, cfgs, ids...)
		case validate:
			res, err = a.ValidateAlterBrokerConfigsState(ctx, cfgs, ids...)
		default:
			res, err = a.AlterBrokerConfigsState(ctx, cfgs, ids...)
		}
	default:
		return nil, rpc.Unsupported("%s config resources", rtype)
	}
	if err != nil {
		return nil, err
	}
	for _, one := range res {
		if one.Err != nil {
			return nil, withMessage(one.Err, one.ErrMessage)
		}
	}
	return nil, nil
}

// alterClientMetrics: kadm addresses topics and brokers only; CLIENT_METRICS resources go as kmsg.
func alterClientMetrics(ctx context.Context, name string, ops []rpc.ConfigOp, incremental, validate bool) error {
	if !incremental {
		req := kmsg.NewPtrAlterConfigsRequest()
		req.ValidateOnly = validate
		res := kmsg.NewAlterConfigsRequestResource()
		res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeClientMetrics, name
		for _, op := range ops {
			c := kmsg.NewAlterConfigsRequestResourceConfig()
			c.Name, c.Value = op.Key, op.Value
			res.Configs = append(res.Configs, c)
		}
		req.Resources = append(req.Resources, res)
		resp, err := req.RequestWith(ctx, adminCl)
		if err != nil {
			return err
		}
		for _, r := range resp.Resources {
			if err := errCode(r.ErrorCode, r.ErrorMessage); err != nil {
				return err
			}
		}
		return nil
	}
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	req.ValidateOnly = validate
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeClientMetrics, name
	for _, op := range ops {
		c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		c.Name, c.Value, c.Op = op.Key, op.Value, kmsg.IncrementalAlterConfigOp(incrementalOps[op.Op])
		res.Configs = append(res.Configs, c)
	}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, adminCl)
	if err != nil {
		return err
	}
	for _, r := range resp.Resources {
		if err := errCode(r.ErrorCode, r.ErrorMessage); err != nil {
			return err
		}
	}
	return nil
}

// describeConfigs sends DescribeConfigs itself: kadm always asks for synonyms, and the scenarios check
// that the broker gives them only when asked.
func describeConfigs(r rpc.Req) (any, error) {
	if _, err := adm(); err != nil {
		return nil, err
	}
	rt, ok := resourceTypes[r.Str("rtype")]
	if !ok {
		return nil, rpc.Unsupported("%s config resources", r.Str("rtype"))
	}
	ctx, cancel := ctx30()
	defer cancel()
	req := kmsg.NewPtrDescribeConfigsRequest()
	req.IncludeSynonyms = r.Bool("synonyms")
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType, res.ResourceName = rt, r.Str("name")
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, adminCl)
	if err != nil {
		return nil, err
	}
	out := map[string]any{}
	for _, rr := range resp.Resources {
		if err := errCode(rr.ErrorCode, rr.ErrorMessage); err != nil {
			return nil, err
		}
		for _, c := range rr.Configs {
			syn := [][]any{}
			for _, s := range c.ConfigSynonyms {
				syn = append(syn, []any{s.Name, s.Value, s.Source.String()})
			}
			out[c.Name] = map[string]any{"value": c.Value, "source": c.Source.String(), "read_only": c.ReadOnly,
				"synonyms": syn}
		}
	}
	return out, nil
}

// --- cluster admin ---------------------------------------------------------------------------------

func describeCluster(r rpc.Req) (any, error) {
	if _, err := adm(); err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	req := kmsg.NewPtrDescribeClusterRequest()
	req.IncludeClusterAuthorizedOperations = r.Bool("authorized_operations")
	resp, err := req.RequestWith(ctx, adminCl)
	if err != nil {
		return nil, err
	}
	if err := errCode(resp.ErrorCode, resp.ErrorMessage); err != nil {
		return nil, err
	}
	brokers := []int32{}
	for _, b := range resp.Brokers {
		brokers = append(brokers, b.NodeID)
	}
	return map[string]any{"cluster_id": resp.ClusterID, "controller": resp.ControllerID, "brokers": brokers,
		"authorized_operations": opsFromBits(resp.ClusterAuthorizedOperations)}, nil
}

func describeTopicDetail(r rpc.Req) (any, error) {
	if _, err := adm(); err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	name := r.Str("name")
	req := kmsg.NewPtrDescribeTopicPartitionsRequest()
	rt := kmsg.NewDescribeTopicPartitionsRequestTopic()
	rt.Topic = name
	req.Topics = append(req.Topics, rt)
	req.ResponsePartitionLimit = 2000
	resp, err := req.RequestWith(ctx, adminCl)
	if err != nil {
		return nil, err
	}
	for _, t := range resp.Topics {
		if t.Topic == nil || *t.Topic != name {
			continue
		}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return nil, err
		}
		parts := map[string]any{}
		for _, p := range t.Partitions {
			parts[fmt.Sprint(p.Partition)] = map[string]any{"leader": p.LeaderID, "replicas": p.Replicas,
				"isr": p.ISR}
		}
		// The request has no flag for them (the answer always carries the field): reported only when
		// asked for, as the Java admin does.
		var ops any
		if r.Bool("authorized_operations") {
			ops = opsFromBits(t.AuthorizedOperations)
		}
		return map[string]any{"topic_id": fmt.Sprintf("%x", t.TopicID), "partitions": parts,
			"authorized_operations": ops}, nil
	}
	return nil, fmt.Errorf("%s not in the answer", name)
}

// topicAuthorizedOperations: Metadata v8+ with IncludeTopicAuthorizedOperations, which every broker since
// Kafka 2.3 answers (DescribeTopicPartitions, which describe_topic_detail sends, is KRaft-only on Kafka 3.x).
func topicAuthorizedOperations(r rpc.Req) (any, error) {
	if _, err := adm(); err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	name := r.Str("name")
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(name)
	req.Topics = append(req.Topics, rt)
	req.IncludeTopicAuthorizedOperations = true
	resp, err := req.RequestWith(ctx, adminCl)
	if err != nil {
		return nil, err
	}
	for _, t := range resp.Topics {
		if t.Topic != nil && *t.Topic == name {
			if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
				return nil, err
			}
			return opsFromBits(t.AuthorizedOperations), nil
		}
	}
	return nil, fmt.Errorf("%s not in the answer", name)
}

func describeLogDirs(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	dirs, err := a.DescribeBrokerLogDirs(ctx, int32(r.Int("broker")), nil)
	if err != nil {
		return nil, err
	}
	out := map[string]any{}
	for path, d := range dirs {
		var e any
		if d.Err != nil {
			e = d.Err.Error()
			var ke *kerr.Error
			if errors.As(d.Err, &ke) {
				e = ke.Message
			}
		}
		replicas := []any{}
		d.Topics.Each(func(p kadm.DescribedLogDirPartition) {
			replicas = append(replicas, map[string]any{"topic": p.Topic, "partition": p.Partition, "size": p.Size,
				"future": p.IsFuture})
		})
		out[path] = map[string]any{"error": e, "replicas": replicas}
	}
	return out, nil
}

func alterReplicaLogDir(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	s := kadm.TopicsSet{}
	s.Add(r.Str("topic"), int32(r.Int("partition")))
	req := kadm.AlterReplicaLogDirsReq{}
	req.Add(r.Str("path"), s)
	res, err := a.AlterBrokerReplicaLogDirs(ctx, int32(r.Int("broker")), req)
	if err != nil {
		return nil, err
	}
	var first error
	res.Each(func(x kadm.AlterReplicaLogDirsResponse) {
		if x.Err != nil && first == nil {
			first = x.Err
		}
	})
	return nil, first
}

func partitionErrors[T any](parts map[int32]T, errOf func(T) error) map[string]any {
	out := map[string]any{}
	for p, v := range parts {
		if err := errOf(v); err != nil {
			var ke *kerr.Error
			if errors.As(err, &ke) {
				out[fmt.Sprint(p)] = ke.Message
			} else {
				out[fmt.Sprint(p)] = err.Error()
			}
		} else {
			out[fmt.Sprint(p)] = nil
		}
	}
	return out
}

func electLeaders(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	s := kadm.TopicsSet{}
	s.Add(r.Str("topic"), r.Ints("partitions")...)
	res, err := a.ElectLeaders(ctx, kadm.ElectPreferredReplica, s)
	if err != nil {
		return nil, err
	}
	return partitionErrors(res[r.Str("topic")], func(x kadm.ElectLeadersResult) error { return x.Err }), nil
}

func alterReassignments(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	req := kadm.AlterPartitionAssignmentsReq{}
	for p, replicas := range r.Targets("targets") {
		if replicas == nil {
			req.CancelAssign(r.Str("topic"), p)
		} else {
			req.Assign(r.Str("topic"), p, replicas)
		}
	}
	res, err := a.AlterPartitionAssignments(ctx, req)
	if err != nil {
		return nil, err
	}
	return partitionErrors(res[r.Str("topic")], func(x kadm.AlterPartitionAssignmentsResponse) error { return x.Err }), nil
}

func listReassignments(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	s := kadm.TopicsSet{}
	s.Add(r.Str("topic"), r.Ints("partitions")...)
	res, err := a.ListPartitionReassignments(ctx, s)
	if err != nil {
		return nil, err
	}
	out := map[string]any{}
	for p, x := range res[r.Str("topic")] {
		out[fmt.Sprint(p)] = map[string]any{"replicas": x.Replicas, "adding": x.AddingReplicas,
			"removing": x.RemovingReplicas}
	}
	return out, nil
}

func quotaEntity(r rpc.Req) kadm.ClientQuotaEntity {
	var e kadm.ClientQuotaEntity
	for k, v := range r.StrMap("entity") {
		e = append(e, kadm.ClientQuotaEntityComponent{Type: k, Name: &v})
	}
	return e
}

func describeClientQuotas(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	var comps []kadm.DescribeClientQuotaComponent
	for _, c := range quotaEntity(r) {
		comps = append(comps, kadm.DescribeClientQuotaComponent{Type: c.Type, MatchName: c.Name, MatchType: 0})
	}
	res, err := a.DescribeClientQuotas(ctx, true, comps)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, q := range res {
		for _, v := range q.Values {
			out[v.Key] = v.Value
		}
	}
	return out, nil
}

func alterClientQuotas(r rpc.Req) (any, error) {
	a, err := adm()
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	entry := kadm.AlterClientQuotaEntry{Entity: quotaEntity(r)}
	for k, v := range r.Quotas("quotas") {
		if v == nil {
			entry.Ops = append(entry.Ops, kadm.AlterClientQuotaOp{Key: k, Remove: true})
		} else {
			entry.Ops = append(entry.Ops, kadm.AlterClientQuotaOp{Key: k, Value: *v})
		}
	}
	var res kadm.AlteredClientQuotas
	if r.Bool("validate_only") {
		res, err = a.ValidateAlterClientQuotas(ctx, []kadm.AlterClientQuotaEntry{entry})
	} else {
		res, err = a.AlterClientQuotas(ctx, []kadm.AlterClientQuotaEntry{entry})
	}
	if err != nil {
		return nil, err
	}
	for _, q := range res {
		if q.Err != nil {
			return nil, withMessage(q.Err, q.ErrMessage)
		}
	}
	return nil, nil
}

// --- KIP-714 ---------------------------------------------------------------------------------------

// instanceLogger keeps the client instance id franz-go logs when a metrics subscription matches it.
type instanceLogger struct {
	mu sync.Mutex
	id string
}

func (l *instanceLogger) Level() kgo.LogLevel { return kgo.LogLevelInfo }

func (l *instanceLogger) Log(_ kgo.LogLevel, msg string, keyvals ...any) {
	if !strings.Contains(msg, "client metrics subscription") {
		return
	}
	for i := 0; i+1 < len(keyvals); i += 2 {
		if keyvals[i] == "client_instance_id" {
			l.mu.Lock()
			l.id = fmt.Sprint(keyvals[i+1])
			l.mu.Unlock()
		}
	}
}

// pushTelemetry runs a client with the given id for hold seconds: franz-go asks for its subscription
// (GetTelemetrySubscriptions) once it has made a request, pushes (PushTelemetry) each interval while
// a subscription matches it, and once more when it closes. It tells its instance id only in its log.
func pushTelemetry(r rpc.Req) (any, error) {
	l := &instanceLogger{}
	opts := append(baseOpts("telemetry"), kgo.WithLogger(l))
	if r.Str("client_id") != "" {
		opts = append(opts, kgo.ClientID(r.Str("client_id")))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	ctx, cancel := ctx30()
	defer cancel()
	if err := cl.Ping(ctx); err != nil {
		cl.Close()
		return nil, err
	}
	time.Sleep(seconds(r, "hold", 0))
	cl.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.id == "" {
		return nil, nil
	}
	return l.id, nil
}
