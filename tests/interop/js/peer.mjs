// A js-libp2p 2.x peer for edgecoder-mesh's interop tests, driven over stdin/stdout with JSON lines.
//
//   node peer.mjs '{"muxer": "yamux", "gossip": {"heartbeatInterval": 1000}}'
//
// On start it prints {"event": "ready", "peerId": ..., "addrs": [...]}. Each command is one line
// {"id": N, "cmd": NAME, ...args}; each answer is one line {"id": N, "ok": true, ...} or {"id": N, "ok": false, "error"}.
// Commands: dial, identify, dialProtocol, exchange, connections, subscribe, unsubscribe, publish, received, control, mesh,
// scores, stop. End of stdin stops the peer too.
//
// What it is built to show, and so how it is configured:
// - Noise + yamux (or mplex only, to show that our node refuses it), TCP on loopback, identify and ping.
// - GossipSub with StrictSign and a message id per topic as docs/protocol.md writes it: sha256(data) on the offers
//   topic, and the spec's default `from || seqno` (PeerID bytes, then the 8-byte big-endian seqno) elsewhere.
// - No topic validator: this peer forwards whatever it is given, so that our node's validator is what is tested.
// - It counts every IHAVE, IWANT and IDONTWANT it sends and receives, per peer and per message id, and every broken
//   IWANT promise it records against a peer (the behaviour penalty js-libp2p applies for it). It notes when it first
//   held each message and when it sent each IWANT, so that an IWANT for a message it already had can be told apart.
// - It only ever dials loopback: the connection gater refuses any other address.

import { createHash } from 'node:crypto'
import { createInterface } from 'node:readline'

import { GossipSub } from '@chainsafe/libp2p-gossipsub'
import { noise } from '@chainsafe/libp2p-noise'
import { yamux } from '@chainsafe/libp2p-yamux'
import { identify } from '@libp2p/identify'
import { mplex } from '@libp2p/mplex'
import { peerIdFromString } from '@libp2p/peer-id'
import { ping } from '@libp2p/ping'
import { tcp } from '@libp2p/tcp'
import { multiaddr } from '@multiformats/multiaddr'
import { createLibp2p } from 'libp2p'

const OFFERS_TOPIC = 'edgecoder/offers/1'

const config = JSON.parse(process.argv[2] ?? '{}')

const hex = (bytes) => Buffer.from(bytes).toString('hex')
const sha256 = (bytes) => new Uint8Array(createHash('sha256').update(bytes).digest())

function seqnoBytes (seqno) {
  const out = new Uint8Array(8)
  new DataView(out.buffer).setBigUint64(0, BigInt(seqno))
  return out
}

function concat (a, b) {
  const out = new Uint8Array(a.length + b.length)
  out.set(a, 0)
  out.set(b, a.length)
  return out
}

// The message id, from a decoded message (what GossipSub hands msgIdFn).
export function messageId (msg) {
  if (msg.topic === OFFERS_TOPIC) return sha256(msg.data)
  return concat(msg.from.toMultihash().bytes, seqnoBytes(msg.sequenceNumber))
}

// The same id from a raw RPC message as it came off the wire (to count duplicates before any decoding).
function rawMessageId (raw) {
  if (raw.topic === OFFERS_TOPIC) return sha256(raw.data ?? new Uint8Array())
  return concat(raw.from ?? new Uint8Array(), raw.seqno ?? new Uint8Array())
}

function isLoopback (ma) {
  try {
    const { host } = ma.toOptions()
    return host.startsWith('127.') || host === '::1'
  } catch {
    return false
  }
}

const newTraffic = () => ({ ihave: {}, iwant: {}, idontwant: {}, graft: {}, prune: {}, messages: {} })

function bump (table, kind, peer, key) {
  const perPeer = (table[kind][peer] ??= {})
  perPeer[key] = (perPeer[key] ?? 0) + 1
}

function count (table, peer, rpc) {
  for (const raw of rpc.messages ?? []) bump(table, 'messages', peer, hex(rawMessageId(raw)))
  const control = rpc.control
  if (control == null) return
  for (const ihave of control.ihave ?? []) for (const id of ihave.messageIDs ?? []) bump(table, 'ihave', peer, hex(id))
  for (const iwant of control.iwant ?? []) for (const id of iwant.messageIDs ?? []) bump(table, 'iwant', peer, hex(id))
  for (const idw of control.idontwant ?? []) for (const id of idw.messageIDs ?? []) bump(table, 'idontwant', peer, hex(id))
  for (const graft of control.graft ?? []) bump(table, 'graft', peer, graft.topicID ?? '')
  for (const prune of control.prune ?? []) bump(table, 'prune', peer, prune.topicID ?? '')
}

// GossipSub with counters on its two choke points: every RPC received goes through handleReceivedRpc, every RPC sent
// (with the gossip and control piggybacked on it) through sendRpc.
class InstrumentedGossipSub extends GossipSub {
  constructor (components, init) {
    super(components, init)
    this.traffic = { sent: newTraffic(), received: newTraffic() }
    this.brokenPromises = {}
    this.firstHeld = {}
    this.iwantsSent = []
    const addPenalty = this.score.addPenalty.bind(this.score)
    // Penalties decay within seconds: keep the worst each peer reached, and what it was for.
    this.worstPenalty = {}
    this.score.addPenalty = (id, penalty, label) => {
      if (label === 'broken_promise') this.brokenPromises[id] = (this.brokenPromises[id] ?? 0) + penalty
      addPenalty(id, penalty, label)
      const now = this.score.peerStats.get(id)?.behaviourPenalty ?? 0
      if (now > (this.worstPenalty[id]?.behaviourPenalty ?? 0)) {
        this.worstPenalty[id] = { behaviourPenalty: now, label }
      }
    }
  }

  async handleReceivedRpc (from, rpc) {
    count(this.traffic.received, from.toString(), rpc)
    // When this peer first held each message, under its own id and under `from || seqno` whatever the topic: an
    // IWANT sent later for either id asked for a message it already had.
    const now = Date.now()
    for (const raw of rpc.messages ?? []) {
      for (const id of [rawMessageId(raw), concat(raw.from ?? new Uint8Array(), raw.seqno ?? new Uint8Array())]) {
        this.firstHeld[hex(id)] ??= now
      }
    }
    return super.handleReceivedRpc(from, rpc)
  }

  sendRpc (id, rpc) {
    const sent = super.sendRpc(id, rpc)
    if (sent) {
      count(this.traffic.sent, id, rpc)
      const now = Date.now()
      for (const iwant of rpc.control?.iwant ?? []) {
        for (const msgId of iwant.messageIDs ?? []) this.iwantsSent.push({ peer: id, id: hex(msgId), at: now })
      }
    }
    return sent
  }
}

const gossipInit = {
  allowPublishToZeroTopicPeers: true,
  emitSelf: false,
  fallbackToFloodsub: false,
  msgIdFn: messageId,
  heartbeatInterval: 1000,
  ...(config.gossip ?? {})
}

const node = await createLibp2p({
  addresses: { listen: ['/ip4/127.0.0.1/tcp/0'] },
  transports: [tcp()],
  connectionEncrypters: [noise()],
  streamMuxers: [config.muxer === 'mplex' ? mplex() : yamux()],
  connectionGater: { denyDialMultiaddr: async (ma) => !isLoopback(ma) },
  services: {
    identify: identify(),
    ping: ping(),
    pubsub: (components) => new InstrumentedGossipSub(components, gossipInit)
  }
})
const pubsub = node.services.pubsub

const received = []
pubsub.addEventListener('gossipsub:message', (event) => {
  const { msg, propagationSource } = event.detail
  received.push({
    topic: msg.topic,
    msgId: hex(messageId(msg)),
    from: msg.type === 'signed' ? msg.from.toString() : null,
    seqno: msg.type === 'signed' ? hex(seqnoBytes(msg.sequenceNumber)) : null,
    source: propagationSource.toString(),
    data: hex(msg.data)
  })
})

const identified = new Map()
node.addEventListener('peer:identify', (event) => {
  const { peerId, protocols, agentVersion } = event.detail
  identified.set(peerId.toString(), { protocols, agentVersion })
})

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

async function waitFor (predicate, timeoutMs, what) {
  const deadline = Date.now() + timeoutMs
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
    await sleep(10)
  }
}

function describe (conn) {
  return {
    peerId: conn.remotePeer.toString(),
    remoteAddr: conn.remoteAddr.toString(),
    direction: conn.direction,
    multiplexer: conn.multiplexer,
    encryption: conn.encryption,
    streams: conn.streams.map((s) => ({ protocol: s.protocol, direction: s.direction }))
  }
}

function target (args) {
  return args.addr != null ? multiaddr(args.addr) : peerIdFromString(args.peer)
}

const commands = {
  async dial (args) {
    const ma = multiaddr(args.addr)
    if (!isLoopback(ma)) throw new Error(`refusing to dial a non-loopback address: ${args.addr}`)
    const conn = await node.dial(ma, { signal: AbortSignal.timeout(args.timeoutMs ?? 10000) })
    return describe(conn)
  },
  async identify (args) {
    await waitFor(() => identified.has(args.peer), args.timeoutMs ?? 10000, `identify of ${args.peer}`)
    return identified.get(args.peer)
  },
  async dialProtocol (args) {
    const stream = await node.dialProtocol(target(args), args.protocol, {
      signal: AbortSignal.timeout(args.timeoutMs ?? 5000)
    })
    const protocol = stream.protocol
    await stream.close()
    return { protocol }
  },
  // One exchange on a request/response protocol, as a client of docs/protocol.md writes it: the caller's bytes as
  // they are (it frames them), then one length-prefixed answer frame read back, returned as hex without its prefix.
  async exchange (args) {
    const stream = await node.dialProtocol(target(args), args.protocol, {
      signal: AbortSignal.timeout(args.timeoutMs ?? 10000)
    })
    const reading = (async () => {
      let held = Buffer.alloc(0)
      for await (const chunk of stream.source) {
        held = Buffer.concat([held, chunk.subarray()])
        if (held.length >= 4 && held.length >= 4 + held.readUInt32BE(0)) return held.subarray(4, 4 + held.readUInt32BE(0))
      }
      throw new Error(`the stream ended after ${held.length} bytes, before a whole answer frame`)
    })()
    await stream.sink([Buffer.from(args.data, 'hex')])
    const answer = await reading
    await stream.close()
    return { answer: hex(answer) }
  },
  async connections () {
    return { connections: node.getConnections().map(describe) }
  },
  async subscribe (args) {
    pubsub.subscribe(args.topic)
    return {}
  },
  async unsubscribe (args) {
    pubsub.unsubscribe(args.topic)
    return {}
  },
  async publish (args) {
    const data = Uint8Array.from(Buffer.from(args.data, 'hex'))
    const result = await pubsub.publish(args.topic, data)
    return { recipients: result.recipients.map((p) => p.toString()) }
  },
  async received () {
    return { messages: received }
  },
  async control () {
    return {
      sent: pubsub.traffic.sent,
      received: pubsub.traffic.received,
      firstHeld: pubsub.firstHeld,
      iwantsSent: pubsub.iwantsSent
    }
  },
  async mesh (args) {
    return {
      mesh: pubsub.getMeshPeers(args.topic),
      subscribers: pubsub.getSubscribers(args.topic).map((p) => p.toString()),
      streams: Object.fromEntries(
        [...pubsub.streamsOutbound.entries()].map(([peer, stream]) => [peer, stream.rawStream.protocol])
      )
    }
  },
  async scores () {
    const stats = pubsub.dumpPeerScoreStats()
    const peers = {}
    for (const [peer, pstats] of Object.entries(stats)) {
      peers[peer] = {
        score: pubsub.getScore(peer),
        behaviourPenalty: pstats.behaviourPenalty,
        brokenPromises: pubsub.brokenPromises[peer] ?? 0,
        worstPenalty: pubsub.worstPenalty[peer] ?? null
      }
    }
    return { peers }
  },
  async stop () {
    setImmediate(shutdown)
    return {}
  }
}

function answer (message) {
  process.stdout.write(JSON.stringify(message) + '\n')
}

let stopping = false
async function shutdown () {
  if (stopping) return
  stopping = true
  try {
    await node.stop()
  } finally {
    process.exit(0)
  }
}

const lines = createInterface({ input: process.stdin })
lines.on('line', async (line) => {
  let request
  try {
    request = JSON.parse(line)
  } catch (err) {
    answer({ id: null, ok: false, error: `not JSON: ${err.message}` })
    return
  }
  const { id, cmd, ...args } = request
  const handler = commands[cmd]
  if (handler == null) {
    answer({ id, ok: false, error: `unknown command ${cmd}` })
    return
  }
  try {
    answer({ id, ok: true, ...(await handler(args)) })
  } catch (err) {
    answer({ id, ok: false, error: `${err.name}: ${err.message}` })
  }
})
lines.on('close', shutdown)
process.on('SIGTERM', shutdown)

answer({ event: 'ready', peerId: node.peerId.toString(), addrs: node.getMultiaddrs().map((a) => a.toString()) })
