// kafkajs driven by the compatibility suite.
//
// One long-lived Node process per test worker.  Requests arrive on stdin as JSON lines
// {"id": n, "op": "...", ...}; they run concurrently and each answer goes to stdout as
// {"id": n, "ok": true, "result": ...} or {"id": n, "ok": false, "error": {"code", "name", "message"}}.
// Bytes travel base64-encoded; null stays null.  See compat/clients/rpc.py.
'use strict'

const readline = require('readline')
const crypto = require('crypto')
const {
  Kafka, logLevel, CompressionTypes, CompressionCodecs, PartitionAssigners, ConfigResourceTypes,
} = require('kafkajs')
const SnappyCodec = require('kafkajs-snappy')
const lz4js = require('lz4js')
const xxh32 = require('lz4js/xxh32.js').hash
const { ZstdCodec } = require('zstd-codec')

// Only the protocol goes to stdout.
const protocolOut = process.stdout
console.log = console.info = console.warn = console.error

const bootstrap = process.argv[2]
// Optional: a SASL_PLAINTEXT identity as JSON {mechanism, username, password} (compat/clients/rpc.py).
const security = process.argv[3] ? JSON.parse(process.argv[3]) : null
const CLIENT_ID = 'compat-kafkajs'

// --- codecs: kafkajs ships gzip only; snappy via kafkajs-snappy, LZ4 (frame format, as Kafka uses)
// via lz4js and zstd via zstd-codec's streaming API (frames from the JVM carry no content size).
let zstd = null
const zstdReady = new Promise(resolve => ZstdCodec.run(z => { zstd = new z.Streaming(); resolve() }))
CompressionCodecs[CompressionTypes.Snappy] = SnappyCodec
CompressionCodecs[CompressionTypes.LZ4] = () => ({
  async compress (encoder) { return lz4CompressFrame(encoder.buffer) },
  async decompress (buffer) { return lz4DecompressFrame(buffer) },
})

// An LZ4 frame writer with independent 64 KB blocks, the form Kafka specifies (the Java client
// refuses linked blocks, which lz4js's own frame writer produces).
function lz4CompressFrame (src) {
  const BLOCK = 64 * 1024
  const header = Buffer.from([0x04, 0x22, 0x4d, 0x18, 0x60, 0x40, 0])
  header[6] = (xxh32(0, header, 4, 2) >> 8) & 0xff
  const parts = [header]
  const hashTable = new Uint32Array(1 << 16)
  const blockBuf = Buffer.alloc(lz4js.compressBound(BLOCK))
  for (let s = 0; s < src.length; s += BLOCK) {
    const len = Math.min(BLOCK, src.length - s)
    hashTable.fill(0) // no match may reach into an earlier block
    const n = lz4js.compressBlock(src, blockBuf, s, len, hashTable)
    const size = Buffer.alloc(4)
    if (n === 0 || n >= len) {
      size.writeUInt32LE((0x80000000 | len) >>> 0)
      parts.push(size, Buffer.from(src.subarray(s, s + len)))
    } else {
      size.writeUInt32LE(n)
      parts.push(size, Buffer.from(blockBuf.subarray(0, n)))
    }
  }
  parts.push(Buffer.alloc(4))
  return Buffer.concat(parts)
}

// An LZ4 frame reader on lz4js's block decoder.  lz4js's own frame reader expects a block's checksum
// before the block (the format puts it after), so frames with block checksums, as cramjam/aiokafka
// write them, fail there.  Blocks are decoded into one buffer so linked blocks can refer back.
function lz4DecompressFrame (src) {
  if (src.readUInt32LE(0) !== 0x184D2204) throw new Error('LZ4: bad magic number')
  const flg = src[4]
  const bd = src[5]
  const blockMax = 1 << (8 + 2 * ((bd >> 4) & 7))
  let i = 6
  if (flg & 0x08) i += 8 // content size
  if (flg & 0x01) i += 4 // dictionary id
  i += 1 // header checksum
  const blocks = []
  for (;;) {
    const size = src.readUInt32LE(i)
    i += 4
    if (size === 0) break
    const len = size & 0x7fffffff
    blocks.push([i, len, (size & 0x80000000) !== 0])
    i += len
    if (flg & 0x10) i += 4 // block checksum
  }
  const dst = Buffer.alloc(Math.max(1, blocks.length * blockMax))
  let d = 0
  for (const [start, len, raw] of blocks) {
    if (raw) {
      src.copy(dst, d, start, start + len)
      d += len
    } else {
      d = lz4js.decompressBlock(src, dst, start, len, d)
    }
  }
  return dst.subarray(0, d)
}
CompressionCodecs[CompressionTypes.ZSTD] = () => ({
  async compress (encoder) { await zstdReady; return Buffer.from(zstd.compress(encoder.buffer, 3)) },
  async decompress (buffer) { await zstdReady; return Buffer.from(zstd.decompress(buffer)) },
})
const CODECS = {
  none: CompressionTypes.None,
  gzip: CompressionTypes.GZIP,
  snappy: CompressionTypes.Snappy,
  lz4: CompressionTypes.LZ4,
  zstd: CompressionTypes.ZSTD,
}

// kafkajs calls its round-robin assignor "RoundRobinAssigner"; every other client calls the standard
// one "roundrobin".  The same assignor under the standard name lets kafkajs share a group with them.
const standardRoundRobin = config => ({ ...PartitionAssigners.roundRobin(config), name: 'roundrobin' })

const kafkaConfig = {
  clientId: CLIENT_ID,
  brokers: [bootstrap],
  logLevel: logLevel[process.env.COMPAT_KAFKAJS_LOG || 'ERROR'],
  retry: { retries: 5, initialRetryTime: 100, maxRetryTime: 2000 },
  requestTimeout: 30000,
  ...(security ? {
    ssl: false,
    sasl: { mechanism: security.mechanism.toLowerCase(), username: security.username, password: security.password },
  } : {}),
}
const kafka = new Kafka(kafkaConfig)

// kafkajs drops the broker's answer when it finds no group coordinator: its broker pool swallows each
// broker's error (GROUP_AUTHORIZATION_FAILED, ...) and the consumer crashes with a bare
// KafkaJSGroupCoordinatorNotFound. Each member's own Kafka instance logs at DEBUG into this hook,
// which keeps the last such error so that the member reports what the broker said.
function memberKafka (m) {
  const logCreator = () => ({ log }) => {
    if (log.message === 'Tried to find group coordinator' && log.error && log.error.type) m.coordinatorError = log.error
  }
  return new Kafka({ ...kafkaConfig, logLevel: logLevel.DEBUG, logCreator })
}

// A fresh admin client per call: a kafkajs admin client remembers every topic it has seen and
// fails later calls once another client has deleted one of them.
const admins = new Set()
async function admin () {
  const a = kafka.admin()
  await a.connect()
  admins.add(a)
  return a
}
async function withAdmin (fn) {
  const a = await admin()
  try {
    return await fn(a)
  } finally {
    admins.delete(a)
    await a.disconnect().catch(() => {})
  }
}

const b64 = b => (b === null || b === undefined ? null : Buffer.from(b).toString('base64'))
const unb64 = s => (s === null || s === undefined ? null : Buffer.from(s, 'base64'))
const sleep = ms => new Promise(resolve => setTimeout(resolve, ms))

function notSupported (what) {
  const e = new Error(what)
  e.notSupported = true
  return e
}

// Kafka error code of a kafkajs error, looking into aggregate and wrapped errors.
function errorCode (e, depth = 0) {
  if (!e || depth > 5) return null
  if (typeof e.code === 'number' && e.code !== 0 && e.type) return e.code
  for (const inner of [].concat(e.errors || [], e.originalError || [], e.cause || [], e.error || [])) {
    const c = errorCode(inner, depth + 1)
    if (c !== null) return c
  }
  return null
}

function describeError (e) {
  if (e && e.notSupported) return { not_supported: true, message: e.message }
  const code = errorCode(e)
  return {
    code: code === null ? -1 : code,
    name: (e && (e.type || e.name)) || 'Error',
    class: (e && e.name) || 'Error',
    message: String((e && e.message) || e),
  }
}

function kafkaHeaders (headers) {
  if (!headers || !headers.length) return undefined
  const out = {}
  for (const [k, v] of headers) {
    if (v === null) throw notSupported('null header values')
    const buf = unb64(v)
    if (k in out) out[k] = [].concat(out[k], buf)
    else out[k] = buf
  }
  return out
}

function fromHeaders (headers) {
  const out = []
  for (const [k, v] of Object.entries(headers || {})) {
    for (const x of [].concat(v)) out.push([k, x === null || x === undefined ? null : b64(x)])
  }
  return out
}

function kafkaMessage (m) {
  const msg = { key: unb64(m.key), value: unb64(m.value), headers: kafkaHeaders(m.headers) }
  if (m.partition !== null && m.partition !== undefined) msg.partition = m.partition
  if (m.timestamp !== null && m.timestamp !== undefined) msg.timestamp = String(m.timestamp)
  return msg
}

function record (topic, partition, m) {
  return {
    topic,
    partition,
    offset: Number(m.offset),
    timestamp: Number(m.timestamp),
    key: b64(m.key),
    value: b64(m.value),
    headers: fromHeaders(m.headers),
  }
}

// --- admin -----------------------------------------------------------------------------------
async function createTopic (r) {
  return withAdmin(async a => {
    const created = await a.createTopics({
      topics: [{
        topic: r.name,
        numPartitions: r.partitions,
        replicationFactor: r.replication_factor,
        configEntries: Object.entries(r.configs || {}).map(([name, value]) => ({ name, value })),
      }],
      waitForLeaders: true,
      timeout: 20000,
    })
    // kafkajs reports the broker's TOPIC_ALREADY_EXISTS as `false`.
    if (created === false) throw Object.assign(new Error(`Topic ${r.name} already exists`), { code: 36, type: 'TOPIC_ALREADY_EXISTS' })
    return null
  })
}

async function describeTopic (r) {
  return withAdmin(async a => {
    const md = await a.fetchTopicMetadata({ topics: [r.name] })
    return md.topics[0].partitions.length
  })
}

async function topicConfigs (r) {
  return withAdmin(async a => {
    const res = await a.describeConfigs({ resources: [{ type: ConfigResourceTypes.TOPIC, name: r.name }], includeSynonyms: false })
    const resource = res.resources[0]
    if (resource.errorCode) throw Object.assign(new Error(resource.errorMessage || 'describe configs'), { code: resource.errorCode, type: 'ERROR' })
    const out = {}
    for (const e of resource.configEntries) out[e.configName] = e.configValue
    return out
  })
}

async function deleteRecords (r) {
  return withAdmin(async a => {
    await a.fetchTopicMetadata({ topics: [r.topic] }) // kafkajs needs the topic's metadata loaded first
    await a.deleteTopicRecords({ topic: r.topic, partitions: [{ partition: r.partition, offset: String(r.before) }] })
    const offs = await a.fetchTopicOffsets(r.topic)
    return Number(offs.find(o => o.partition === r.partition).low)
  })
}

async function metadata () {
  return withAdmin(async a => {
    const cluster = await describeClusterOf(a)
    const md = await a.fetchTopicMetadata()
    const topics = {}
    for (const t of md.topics) topics[t.name] = t.partitions.length
    return { brokers: cluster.brokers.map(b => b.nodeId), topics }
  })
}

// --- produce ---------------------------------------------------------------------------------
function deliveries (msgs, results) {
  // kafkajs returns one result per partition (the batch's base offset); records with an explicit
  // partition get base offset + their index in that partition's batch.
  const base = {}
  for (const res of results || []) base[res.partition] = Number(res.baseOffset)
  const seen = {}
  return msgs.map(m => {
    if (m.partition === undefined || base[m.partition] === undefined || base[m.partition] < 0) {
      return { partition: m.partition === undefined ? -1 : m.partition, offset: -1 }
    }
    seen[m.partition] = (seen[m.partition] || 0) + 1
    return { partition: m.partition, offset: base[m.partition] + seen[m.partition] - 1 }
  })
}

async function produce (r) {
  const producer = kafka.producer({
    idempotent: !!r.idempotent,
    maxInFlightRequests: r.idempotent ? 1 : undefined,
    allowAutoTopicCreation: false,
  })
  await producer.connect()
  try {
    const msgs = r.msgs.map(kafkaMessage)
    const acks = r.acks === 'all' ? -1 : Number(r.acks)
    const results = await producer.send({
      topic: r.topic, messages: msgs, acks, compression: CODECS[r.compression], timeout: Math.round(r.timeout * 1000),
    })
    return deliveries(msgs, acks === 0 ? [] : results)
  } finally {
    await producer.disconnect()
  }
}

function txnProducer (r) {
  return kafka.producer({
    transactionalId: r.transactional_id, idempotent: true, maxInFlightRequests: 1, allowAutoTopicCreation: false,
  })
}

async function produceTransactions (r) {
  const producer = txnProducer(r)
  await producer.connect()
  try {
    for (const t of r.txns) {
      const txn = await producer.transaction()
      try {
        await txn.send({ topic: r.topic, messages: t.msgs.map(kafkaMessage), acks: -1 })
      } catch (e) {
        await txn.abort()
        throw e
      }
      if (t.commit) await txn.commit()
      else await txn.abort()
    }
  } finally {
    await producer.disconnect()
  }
  return null
}

async function transactionalOffsets (r) {
  const producer = txnProducer(r)
  await producer.connect()
  try {
    const txn = await producer.transaction()
    await txn.send({ topic: r.topic, messages: r.msgs.map(kafkaMessage), acks: -1 })
    const offsets = {
      consumerGroupId: r.group,
      topics: [{
        topic: r.offsets_topic,
        partitions: Object.entries(r.offsets).map(([p, o]) => ({ partition: Number(p), offset: String(o) })),
      }],
    }
    // The group's coordinator may be moving or loading (a busy 3-broker Kafka answered COORDINATOR_NOT_AVAILABLE
    // past kafkajs's own retries): ask again, as an application would, at most 10 times.
    for (let attempt = 1; ; attempt++) {
      try {
        await txn.sendOffsets(offsets)
        break
      } catch (e) {
        if (attempt >= 10 || ![14, 15, 16].includes(errorCode(e))) throw e
        await sleep(300 * attempt)
      }
    }
    if (r.commit) await txn.commit()
    else await txn.abort()
  } finally {
    await producer.disconnect()
  }
  return null
}

// --- consume (kafkajs can only consume in a group: a fresh group per call) --------------------
async function consume (r) {
  if (r.reset === 'none') throw notSupported('auto.offset.reset=none')
  const consumer = kafka.consumer({
    groupId: `compat-kafkajs-${crypto.randomBytes(5).toString('hex')}`,
    readUncommitted: r.isolation === 'read_uncommitted',
    maxWaitTimeInMs: 100,
    sessionTimeout: 10000,
    heartbeatInterval: 500,
    allowAutoTopicCreation: false,
    partitionAssigners: [standardRoundRobin],
    maxBytesPerPartition: 2000000,
  })
  const wanted = new Set(r.partitions)
  const out = []
  let last = Date.now()
  const deadline = Date.now() + r.timeout * 1000
  await consumer.connect()
  try {
    const fromBeginning = r.start === 'earliest' || (typeof r.start === 'number' && r.reset === 'earliest')
    await consumer.subscribe({ topic: r.topic, fromBeginning })
    await consumer.run({
      autoCommit: false,
      eachMessage: async ({ topic, partition, message }) => {
        if (!wanted.has(partition)) return
        if (out.length < r.count) out.push(record(topic, partition, message))
        last = Date.now()
      },
    })
    if (typeof r.start === 'number') {
      for (const p of r.partitions) consumer.seek({ topic: r.topic, partition: p, offset: String(r.start) })
    }
    last = Date.now()
    while (out.length < r.count && Date.now() < deadline) {
      if (r.idle !== null && r.idle !== undefined && Date.now() - last > r.idle * 1000) break
      await sleep(50)
    }
  } finally {
    await consumer.disconnect()
  }
  return out
}

async function listOffset (r) {
  return withAdmin(async a => {
    if (r.spec === 'earliest' || r.spec === 'latest') {
      const offs = await a.fetchTopicOffsets(r.topic)
      const o = offs.find(x => x.partition === r.partition)
      return Number(r.spec === 'earliest' ? o.low : o.high)
    }
    const offs = await a.fetchTopicOffsetsByTimestamp(r.topic, r.spec)
    const found = Number(offs.find(x => x.partition === r.partition).offset)
    // Where the broker answers -1 (no record that late), kafkajs substitutes the high watermark; any
    // real match lies below it, so this gives back exactly what the broker said.
    const high = Number((await a.fetchTopicOffsets(r.topic)).find(x => x.partition === r.partition).high)
    return found === high ? -1 : found
  })
}

// --- groups ----------------------------------------------------------------------------------
const members = new Map()
let memberSeq = 0

async function startMember (r) {
  if (r.protocol !== 'classic') throw notSupported('group.protocol=consumer')
  if (r.assignor !== 'roundrobin') throw notSupported(`assignor ${r.assignor}`)
  const m = { consumer: null, records: [], assignment: [], error: null, failed: false, coordinatorError: null }
  const consumer = m.consumer = memberKafka(m).consumer({
    groupId: r.group,
    sessionTimeout: r.session_timeout_ms,
    heartbeatInterval: 500,
    maxWaitTimeInMs: 100,
    allowAutoTopicCreation: false,
    partitionAssigners: [standardRoundRobin],
  })
  consumer.on(consumer.events.GROUP_JOIN, e => {
    const a = []
    for (const [topic, parts] of Object.entries(e.payload.memberAssignment || {})) {
      for (const p of parts) a.push([topic, p])
    }
    m.assignment = a
  })
  consumer.on(consumer.events.REBALANCING, () => { m.assignment = [] })
  consumer.on(consumer.events.CRASH, e => {
    // With the Kafka error's type (GROUP_AUTHORIZATION_FAILED, ...) when there is one.
    m.error = (e.payload.error && e.payload.error.type ? `${e.payload.error.type}: ` : '') + String(e.payload.error)
    const cause = m.coordinatorError
    if (cause && e.payload.error && e.payload.error.name === 'KafkaJSGroupCoordinatorNotFound') {
      m.error += ` (the broker answered FindCoordinator with ${cause.type}: ${cause.message})`
    }
    if (!e.payload.restart) m.failed = true // kafkajs gives up on this member
  })
  await consumer.connect()
  for (const t of r.topics) await consumer.subscribe({ topic: t, fromBeginning: r.reset === 'earliest' })
  await consumer.run({
    autoCommit: !!r.auto_commit,
    autoCommitInterval: 200,
    eachMessage: async ({ topic, partition, message }) => {
      m.records.push(record(topic, partition, message))
      if (!r.auto_commit) {
        await consumer.commitOffsets([{ topic, partition, offset: String(Number(message.offset) + 1) }])
      }
    },
  })
  const id = `m${++memberSeq}`
  members.set(id, m)
  return id
}

function memberState (m) {
  const records = m.records
  m.records = []
  return { assignment: m.assignment, records, error: m.error, failed: m.failed }
}

async function memberClose (r) {
  const m = members.get(r.member)
  if (!m) return null
  members.delete(r.member)
  await m.consumer.disconnect()
  m.assignment = []
  return memberState(m)
}

async function commitOffsets (r) {
  return withAdmin(async a => {
    await a.setOffsets({
      groupId: r.group,
      topic: r.topic,
      partitions: Object.entries(r.offsets).map(([p, o]) => ({ partition: Number(p), offset: String(o) })),
    })
    return null
  })
}

async function committedOffsets (r) {
  return withAdmin(async a => {
    const res = await a.fetchOffsets({ groupId: r.group, topics: [r.topic] })
    const out = {}
    for (const p of r.partitions) out[p] = -1
    for (const t of res) {
      for (const p of t.partitions) if (p.partition in out) out[p.partition] = Number(p.offset)
    }
    return out
  })
}

// --- configs and cluster admin ----------------------------------------------------------------
const RESOURCE_TYPES = { topic: ConfigResourceTypes.TOPIC, broker: ConfigResourceTypes.BROKER }

function configResource (r) {
  const type = RESOURCE_TYPES[r.rtype]
  // kafkajs refuses an empty resource name, so the cluster-wide broker default cannot be addressed.
  if (type === undefined || !r.name) throw notSupported(`${r.rtype} config resource ${JSON.stringify(r.name)}`)
  return { type, name: r.name }
}

function resourceError (resource) {
  if (resource.errorCode) {
    throw Object.assign(new Error(resource.errorMessage || 'config resource error'), { code: resource.errorCode, type: 'ERROR' })
  }
}

async function alterConfigs (r) {
  if (r.incremental) throw notSupported('IncrementalAlterConfigs')
  if (r.ops.some(([op]) => op !== 'set')) throw new Error('AlterConfigs only sets configs')
  const resource = { ...configResource(r), configEntries: r.ops.map(([, name, value]) => ({ name, value })) }
  return withAdmin(async a => {
    const res = await a.alterConfigs({ resources: [resource], validateOnly: !!r.validate_only })
    res.resources.forEach(resourceError)
    return null
  })
}

async function describeConfigs (r) {
  const resource = configResource(r)
  return withAdmin(async a => {
    const res = await a.describeConfigs({ resources: [resource], includeSynonyms: !!r.synonyms })
    const described = res.resources[0]
    resourceError(described)
    const out = {}
    for (const e of described.configEntries) {
      out[e.configName] = {
        value: e.configValue,
        source: e.configSource,
        read_only: e.readOnly,
        synonyms: (e.configSynonyms || []).map(x => [x.configName, x.configValue, x.configSource]),
      }
    }
    return out
  })
}

// kafkajs's describeCluster destructures the result of brokerPool.withBroker(), which swallows each
// broker's error and returns null when every attempt failed (a TypeError, not the broker's error):
// ask again, a bounded number of times, as a caller of kafkajs must.
async function describeClusterOf (a) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await a.describeCluster()
    } catch (e) {
      if (!(e instanceof TypeError) || attempt >= 3) throw e
      await new Promise(resolve => setTimeout(resolve, 500))
    }
  }
}

async function describeCluster (r) {
  if (r.authorized_operations) throw notSupported("the cluster's authorized operations")
  return withAdmin(async a => {
    const d = await describeClusterOf(a)
    return {
      cluster_id: d.clusterId,
      controller: d.controller === null ? -1 : d.controller,
      brokers: d.brokers.map(b => b.nodeId),
      authorized_operations: null,
    }
  })
}

async function alterReassignments (r) {
  const out = {}
  await withAdmin(async a => {
    for (const [partition, replicas] of Object.entries(r.targets)) {
      // kafkajs requires a replica list: it cannot cancel a reassignment.
      if (replicas === null) throw notSupported('cancelling a partition reassignment')
      try {
        await a.alterPartitionReassignments({
          topics: [{ topic: r.topic, partitionAssignment: [{ partition: Number(partition), replicas }] }],
        })
        out[partition] = null
      } catch (e) {
        const code = errorCode(e)
        if (code === null) throw e
        out[partition] = code
      }
    }
  })
  return out
}

async function listReassignments (r) {
  return withAdmin(async a => {
    const res = await a.listPartitionReassignments({ topics: [{ topic: r.topic, partitions: r.partitions }] })
    const out = {}
    for (const t of res.topics) {
      for (const p of t.partitions) {
        out[p.partition] = { replicas: p.replicas, adding: p.addingReplicas, removing: p.removingReplicas }
      }
    }
    return out
  })
}

// --- dispatch --------------------------------------------------------------------------------
const OPS = {
  alter_configs: alterConfigs,
  describe_configs: describeConfigs,
  describe_cluster: describeCluster,
  alter_reassignments: alterReassignments,
  list_reassignments: listReassignments,
  ping: async () => 'pong',
  create_topic: createTopic,
  delete_topic: r => withAdmin(async a => { await a.deleteTopics({ topics: [r.name], timeout: 20000 }); return null }),
  create_partitions: r => withAdmin(async a => {
    await a.createPartitions({ topicPartitions: [{ topic: r.name, count: r.total }] })
    return null
  }),
  describe_topic: describeTopic,
  topic_configs: topicConfigs,
  delete_records: deleteRecords,
  metadata,
  produce,
  produce_transactions: produceTransactions,
  transactional_offsets: transactionalOffsets,
  consume,
  list_offset: listOffset,
  start_member: startMember,
  member_state: async r => memberState(members.get(r.member)),
  member_close: memberClose,
  commit_offsets: commitOffsets,
  list_groups: () => withAdmin(async a => (await a.listGroups()).groups.map(g => g.groupId)),
  describe_group: r => withAdmin(async a => {
    const g = (await a.describeGroups([r.group])).groups[0]
    if (g.errorCode) throw Object.assign(new Error('describe group'), { code: g.errorCode, type: 'ERROR' })
    return { state: g.state, members: g.members.length }
  }),
  delete_group: r => withAdmin(async a => { await a.deleteGroups([r.group]); return null }),
  committed_offsets: committedOffsets,
}

function reply (msg) {
  protocolOut.write(JSON.stringify(msg) + '\n')
}

async function handle (req) {
  try {
    const op = OPS[req.op]
    if (!op) throw new Error(`unknown op ${req.op}`)
    reply({ id: req.id, ok: true, result: await op(req) })
  } catch (e) {
    reply({ id: req.id, ok: false, error: describeError(e) })
  }
}

async function shutdown () {
  for (const m of members.values()) await m.consumer.disconnect().catch(() => {})
  for (const a of admins) await a.disconnect().catch(() => {})
  process.exit(0)
}

const rl = readline.createInterface({ input: process.stdin })
rl.on('line', line => { if (line.trim()) handle(JSON.parse(line)) })
rl.on('close', shutdown)
zstdReady.then(() => reply({ id: 0, ok: true, result: { version: require('kafkajs/package.json').version } }))
