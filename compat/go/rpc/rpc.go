// Package rpc is the JSON-lines protocol the compatibility suite speaks with its driver processes
// (compat/clients/rpc.py), shared by the Go drivers.
//
// Requests arrive on stdin as {"id": n, "op": "...", ...}; each runs in its own goroutine and its answer
// goes to stdout as {"id": n, "ok": true, "result": ...} or {"id": n, "ok": false, "error": {...}}.
// Bytes travel base64-encoded; null stays null. The first line out is {"id": 0, "ok": true,
// "result": {"version": ...}}.
package rpc

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
)

// Req is one request's arguments.
type Req map[string]any

// Handler runs one op.
type Handler func(Req) (any, error)

// NotSupported is what the library cannot express: reported as "not supported by the client".
type NotSupported struct{ What string }

func (e *NotSupported) Error() string { return e.What }

// Unsupported builds a NotSupported error.
func Unsupported(format string, args ...any) error {
	return &NotSupported{fmt.Sprintf(format, args...)}
}

// KafkaError is a protocol error code the driver learnt from somewhere other than the library's error
// values (a field of a response).
type KafkaError struct {
	Code    int16
	Message string
}

func (e *KafkaError) Error() string { return fmt.Sprintf("kafka error %d: %s", e.Code, e.Message) }

// Classifier maps a library error to a Kafka error code (0 or -1 when it is none).
type Classifier func(error) int16

// Codes and names the drivers use themselves.
const (
	RequestTimedOut  int16 = 7
	OffsetOutOfRange int16 = 1
)

var (
	outMu sync.Mutex
	out   = bufio.NewWriter(os.Stdout)
)

func reply(msg map[string]any) {
	b, err := json.Marshal(msg)
	if err != nil {
		b, _ = json.Marshal(map[string]any{"id": msg["id"], "ok": false,
			"error": map[string]any{"code": -1, "name": "EncodeError", "message": err.Error()}})
	}
	outMu.Lock()
	defer outMu.Unlock()
	out.Write(b)
	out.WriteByte('\n')
	out.Flush()
}

// Serve answers requests until stdin closes, then calls shutdown and returns.
func Serve(version string, ops map[string]Handler, classify Classifier, shutdown func()) {
	reply(map[string]any{"id": 0, "ok": true, "result": map[string]any{"version": version}})
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	var wg sync.WaitGroup
	for in.Scan() {
		line := in.Bytes()
		if len(line) == 0 {
			continue
		}
		var r Req
		dec := json.NewDecoder(bytesReader(line))
		dec.UseNumber()
		if err := dec.Decode(&r); err != nil {
			fmt.Fprintf(os.Stderr, "bad request %q: %v\n", line, err)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			handle(r, ops, classify)
		}()
	}
	shutdown()
}

func handle(r Req, ops map[string]Handler, classify Classifier) {
	id := r["id"]
	defer func() {
		if p := recover(); p != nil {
			reply(map[string]any{"id": id, "ok": false, "error": map[string]any{
				"code": -1, "name": "panic", "class": "panic", "message": fmt.Sprint(p)}})
		}
	}()
	op, _ := r["op"].(string)
	h, ok := ops[op]
	if !ok {
		reply(map[string]any{"id": id, "ok": false, "error": map[string]any{
			"code": -1, "name": "UnknownOp", "message": "unknown op " + op}})
		return
	}
	res, err := h(r)
	if err != nil {
		reply(map[string]any{"id": id, "ok": false, "error": Describe(err, classify)})
		return
	}
	reply(map[string]any{"id": id, "ok": true, "result": res})
}

// Describe is an error as the Python side reads it.
func Describe(err error, classify Classifier) map[string]any {
	var ns *NotSupported
	if errors.As(err, &ns) {
		return map[string]any{"not_supported": true, "message": ns.What}
	}
	code := int16(-1)
	var ke *KafkaError
	switch {
	case errors.As(err, &ke):
		code = ke.Code
	case errors.Is(err, context.DeadlineExceeded):
		code = RequestTimedOut
	default:
		if c := classify(err); c > 0 {
			code = c
		}
	}
	return map[string]any{"code": code, "name": fmt.Sprintf("%T", err), "class": fmt.Sprintf("%T", err),
		"message": err.Error()}
}

// --- arguments -------------------------------------------------------------------------------------

func (r Req) Str(k string) string {
	s, _ := r[k].(string)
	return s
}

func (r Req) Has(k string) bool { return r[k] != nil }

func num(v any) int64 {
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		f, _ := x.Float64()
		return int64(f)
	case float64:
		return int64(x)
	case int:
		return int64(x)
	case int64:
		return x
	}
	return 0
}

func (r Req) Int(k string) int64 { return num(r[k]) }

func (r Req) Float(k string) float64 {
	switch x := r[k].(type) {
	case json.Number:
		f, _ := x.Float64()
		return f
	case float64:
		return x
	}
	return 0
}

func (r Req) Bool(k string) bool {
	b, _ := r[k].(bool)
	return b
}

// Ints is a list of numbers.
func (r Req) Ints(k string) []int32 {
	l, _ := r[k].([]any)
	out := make([]int32, 0, len(l))
	for _, v := range l {
		out = append(out, int32(num(v)))
	}
	return out
}

// Strs is a list of strings.
func (r Req) Strs(k string) []string {
	l, _ := r[k].([]any)
	out := make([]string, 0, len(l))
	for _, v := range l {
		s, _ := v.(string)
		out = append(out, s)
	}
	return out
}

// StrMap is an object of strings.
func (r Req) StrMap(k string) map[string]string {
	m, _ := r[k].(map[string]any)
	out := map[string]string{}
	for key, v := range m {
		s, _ := v.(string)
		out[key] = s
	}
	return out
}

// PartitionOffsets is {"partition": offset}.
func (r Req) PartitionOffsets(k string) map[int32]int64 {
	m, _ := r[k].(map[string]any)
	out := map[int32]int64{}
	for key, v := range m {
		p, _ := strconv.Atoi(key)
		out[int32(p)] = num(v)
	}
	return out
}

// SortedPartitions are the keys of a partition map in order.
func SortedPartitions(m map[int32]int64) []int32 {
	out := make([]int32, 0, len(m))
	for p := range m {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Targets is {"partition": [replicas] or null}.
func (r Req) Targets(k string) map[int32][]int32 {
	m, _ := r[k].(map[string]any)
	out := map[int32][]int32{}
	for key, v := range m {
		p, _ := strconv.Atoi(key)
		if v == nil {
			out[int32(p)] = nil
			continue
		}
		l, _ := v.([]any)
		rs := make([]int32, 0, len(l))
		for _, x := range l {
			rs = append(rs, int32(num(x)))
		}
		out[int32(p)] = rs
	}
	return out
}

// ConfigOp is one (op, key, value) of alter_configs.
type ConfigOp struct {
	Op, Key string
	Value   *string
}

func (r Req) ConfigOps(k string) []ConfigOp {
	l, _ := r[k].([]any)
	out := make([]ConfigOp, 0, len(l))
	for _, v := range l {
		t, _ := v.([]any)
		op := ConfigOp{}
		op.Op, _ = t[0].(string)
		op.Key, _ = t[1].(string)
		if s, ok := t[2].(string); ok {
			op.Value = &s
		}
		out = append(out, op)
	}
	return out
}

// Quotas is {"key": number or null}.
func (r Req) Quotas(k string) map[string]*float64 {
	m, _ := r[k].(map[string]any)
	out := map[string]*float64{}
	for key, v := range m {
		if v == nil {
			out[key] = nil
			continue
		}
		f, _ := v.(json.Number).Float64()
		out[key] = &f
	}
	return out
}

// --- messages and records ----------------------------------------------------------------------------

// Header is a record header; Value nil is a null value.
type Header struct {
	Key   string
	Value []byte
}

// Msg is a message to produce.
type Msg struct {
	Key, Value []byte
	Headers    []Header
	Partition  int32 // -1: the client's partitioner chooses
	Timestamp  int64 // -1: the client sets it
}

func unb64(v any) []byte {
	s, ok := v.(string)
	if !ok {
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		panic(fmt.Sprintf("bad base64 %q", s))
	}
	if b == nil {
		b = []byte{}
	}
	return b
}

// B64 encodes bytes, nil as null.
func B64(b []byte) any {
	if b == nil {
		return nil
	}
	return base64.StdEncoding.EncodeToString(b)
}

// Msgs are the messages under key k.
func (r Req) Msgs(k string) []Msg {
	l, _ := r[k].([]any)
	out := make([]Msg, 0, len(l))
	for _, v := range l {
		m, _ := v.(map[string]any)
		msg := Msg{Key: unb64(m["key"]), Value: unb64(m["value"]), Partition: -1, Timestamp: -1}
		if m["partition"] != nil {
			msg.Partition = int32(num(m["partition"]))
		}
		if m["timestamp"] != nil {
			msg.Timestamp = num(m["timestamp"])
		}
		hs, _ := m["headers"].([]any)
		for _, h := range hs {
			kv, _ := h.([]any)
			name, _ := kv[0].(string)
			msg.Headers = append(msg.Headers, Header{Key: name, Value: unb64(kv[1])})
		}
		out = append(out, msg)
	}
	return out
}

// Record is a consumed record as the Python side reads it.
func Record(topic string, partition int32, offset, timestamp int64, key, value []byte, headers []Header) map[string]any {
	hs := make([][]any, 0, len(headers))
	for _, h := range headers {
		hs = append(hs, []any{h.Key, B64(h.Value)})
	}
	return map[string]any{"topic": topic, "partition": partition, "offset": offset, "timestamp": timestamp,
		"key": B64(key), "value": B64(value), "headers": hs}
}

// Delivery is where a produced record landed (offset -1 when the client does not learn it).
func Delivery(partition int32, offset int64) map[string]any {
	return map[string]any{"partition": partition, "offset": offset}
}

// Sasl is the optional second argument: {mechanism, username, password}.
type Sasl struct {
	Mechanism string `json:"mechanism"`
	Username  string `json:"username"`
	Password  string `json:"password"`
}

// Args are the driver's command-line arguments: the bootstrap address and an optional SASL identity.
func Args() (string, *Sasl) {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: driver BOOTSTRAP [SASL-JSON]")
		os.Exit(2)
	}
	if len(os.Args) > 2 && os.Args[2] != "" {
		var s Sasl
		if err := json.Unmarshal([]byte(os.Args[2]), &s); err != nil {
			fmt.Fprintln(os.Stderr, "bad SASL argument:", err)
			os.Exit(2)
		}
		return os.Args[1], &s
	}
	return os.Args[1], nil
}

// --- group members --------------------------------------------------------------------------------

// MemberState is what a group member collected since it was last asked.
type MemberState struct {
	mu         sync.Mutex
	records    []map[string]any
	assignment map[[2]any]bool
	err        string
	failed     bool
}

func NewMemberState() *MemberState { return &MemberState{assignment: map[[2]any]bool{}} }

func (m *MemberState) Add(rec map[string]any) {
	m.mu.Lock()
	m.records = append(m.records, rec)
	m.mu.Unlock()
}

func (m *MemberState) Assign(topic string, parts []int32) {
	m.mu.Lock()
	for _, p := range parts {
		m.assignment[[2]any{topic, p}] = true
	}
	m.mu.Unlock()
}

func (m *MemberState) Revoke(topic string, parts []int32) {
	m.mu.Lock()
	for _, p := range parts {
		delete(m.assignment, [2]any{topic, p})
	}
	m.mu.Unlock()
}

func (m *MemberState) SetAssignment(a map[string][]int32) {
	m.mu.Lock()
	m.assignment = map[[2]any]bool{}
	for t, ps := range a {
		for _, p := range ps {
			m.assignment[[2]any{t, p}] = true
		}
	}
	m.mu.Unlock()
}

// Fail records the member's error; fatal: it stopped for good.
func (m *MemberState) Fail(err string, fatal bool) {
	m.mu.Lock()
	m.err = err
	if fatal {
		m.failed = true
	}
	m.mu.Unlock()
}

// Take is the state for member_state: the records since the last call, the assignment, the error.
func (m *MemberState) Take() map[string]any {
	m.mu.Lock()
	defer m.mu.Unlock()
	recs := m.records
	m.records = nil
	if recs == nil {
		recs = []map[string]any{}
	}
	a := make([][]any, 0, len(m.assignment))
	for tp := range m.assignment {
		a = append(a, []any{tp[0], tp[1]})
	}
	var e any
	if m.err != "" {
		e = m.err
	}
	return map[string]any{"assignment": a, "records": recs, "error": e, "failed": m.failed}
}

// Members is the driver's registry of group members.
type Members[T any] struct {
	mu  sync.Mutex
	seq int
	m   map[string]T
}

func (ms *Members[T]) Put(v T) string {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.m == nil {
		ms.m = map[string]T{}
	}
	ms.seq++
	id := "m" + strconv.Itoa(ms.seq)
	ms.m[id] = v
	return id
}

func (ms *Members[T]) Get(id string) (T, bool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	v, ok := ms.m[id]
	return v, ok
}

func (ms *Members[T]) Remove(id string) (T, bool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	v, ok := ms.m[id]
	delete(ms.m, id)
	return v, ok
}

func (ms *Members[T]) All() []T {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	out := make([]T, 0, len(ms.m))
	for _, v := range ms.m {
		out = append(out, v)
	}
	return out
}

// ErrorText is an error with Kafka's name of its code first, when it has one ("GROUP_AUTHORIZATION_FAILED:
// ..."): libraries whose error texts are prose still say which error it was.
func ErrorText(err error, classify Classifier) string {
	if c := classify(err); c > 0 {
		return ErrorName(c) + ": " + err.Error()
	}
	return err.Error()
}
