package dev.decree.jta;

import dev.decree.jta.DecreeException.LostReply;
import dev.decree.jta.DecreeException.NotSent;
import dev.decree.jta.DecreeException.ServerError;
import dev.decree.jta.DecreeException.Unavailable;
import dev.decree.jta.Message.Branch;
import dev.decree.jta.Message.Frame;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.util.List;
import java.util.Set;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.ReentrantLock;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One session (connection) to a decree server (docs/protocol.md, "The session"). It mints
 * the Xids of its transactions (node | incarnation | session | sequence), sends their
 * decisions and one-phase notices, buffers their completions, and asks outcomes. Used by one
 * thread at a time (the transaction that holds it, or the keep-alive through {@link #lock}).
 */
final class ServerSession implements AutoCloseable {
    private static final Logger log = LoggerFactory.getLogger("dev.decree.jta");
    private static final int COMPLETES_BUFFERED_MAX = 16;

    final Endpoint endpoint;
    final long node;
    final long incarnation;
    final long session;
    final int version;
    final int frameBytesMax;
    final long inflightMax;
    final long idleTimeoutMs;
    private final SessionOptions options;
    private final Transport transport;
    private final Protocol.Decoder decoder;
    private final AtomicLong sequence = new AtomicLong();
    private long requestId = 1;
    private final ByteArrayOutputStream buffered = new ByteArrayOutputStream();
    private int bufferedCount;
    private volatile boolean broken;
    private volatile boolean closed;
    volatile long lastSentNanos = System.nanoTime();
    final ReentrantLock lock = new ReentrantLock();
    private final byte[] readBuf = new byte[16384];

    private ServerSession(Endpoint ep, SessionOptions o, Transport t, Message.HelloOk ok, long nextRequest) {
        this.endpoint = ep;
        this.options = o;
        this.transport = t;
        this.node = ok.node();
        this.incarnation = ok.incarnation();
        this.session = ok.session();
        this.version = ok.version();
        this.frameBytesMax = (int) Math.min(ok.frameBytesMax(), Protocol.FRAME_BYTES_MAX);
        this.inflightMax = ok.inflightMax();
        this.idleTimeoutMs = ok.negotiated() == null ? 0 : ok.negotiated().idleTimeoutMs();
        this.decoder = new Protocol.Decoder(frameBytesMax, version);
        this.requestId = nextRequest;
    }

    /** Connects and says hello, offering versions 1 to 3 (and again with a plain Hello to a server that refuses the list). */
    static ServerSession open(Endpoint ep, SessionOptions o) throws Unavailable, ServerError {
        try {
            return hello(ep, o, Protocol.PROTOCOL_VERSIONS);
        } catch (ServerError e) {
            if (e.code() == ErrorCodes.MALFORMED) {
                // A server older than protocol version 2 refuses the version list as malformed.
                log.info("{}: the server refused the version list ({}); saying hello as a version-1 client", ep, e.serverMessage());
                return hello(ep, o, List.of());
            }
            throw e;
        }
    }

    private static ServerSession hello(Endpoint ep, SessionOptions o, List<Integer> versions) throws Unavailable, ServerError {
        Transport t;
        try {
            t = Transport.open(ep, o);
        } catch (IOException e) {
            throw new Unavailable(ep + ": cannot connect: " + e.getMessage(), e);
        }
        try {
            t.write(Protocol.encodeFrame(1, new Message.Hello(o.nodeExpected(), o.clientName(), versions)));
            Protocol.Decoder d = new Protocol.Decoder(Protocol.FRAME_BYTES_MAX, 1);
            byte[] buf = new byte[4096];
            long deadline = System.nanoTime() + o.connectTimeoutMs() * 1_000_000;
            byte[] first = null;
            while (true) {
                Frame f;
                try {
                    f = d.next();
                } catch (FrameException fe) {
                    throw new Unavailable(ep + ": the peer does not answer like a decree server (" + fe.getMessage() + ")"
                            + (first == null ? "" : peerGuess(first)), fe);
                }
                if (f != null) {
                    if (f.message() instanceof Message.Error err) {
                        throw new ServerError(err.code(), err.message());
                    }
                    if (!(f.message() instanceof Message.HelloOk ok)) {
                        throw new Unavailable(ep + ": expected HelloOk, got " + f.message(), null);
                    }
                    if (!versions.isEmpty() && ok.negotiated() != null && !versions.contains(ok.version())) {
                        throw new Unavailable(ep + ": the server chose version " + ok.version() + ", which was not offered", null);
                    }
                    if (!versions.isEmpty() && ok.negotiated() == null) {
                        log.debug("{}: HelloOk without a trailer: version 1", ep);
                    }
                    if (Protocol.unknownMustUnderstand(f.trailer(), Set.of()) != null) {
                        throw new Unavailable(ep + ": HelloOk carries a must-understand field this client does not know", null);
                    }
                    ServerSession s = new ServerSession(ep, o, t, ok, 2);
                    if (d.buffered() > 0) {
                        throw new Unavailable(ep + ": bytes after HelloOk before any request", null);
                    }
                    log.debug("{}: session {} (node {}, incarnation {}, protocol version {}, idle timeout {} ms)", ep,
                            Long.toUnsignedString(s.session), Long.toUnsignedString(s.node), Long.toUnsignedString(s.incarnation),
                            s.version, s.idleTimeoutMs);
                    return s;
                }
                long left = (deadline - System.nanoTime()) / 1_000_000;
                if (left <= 0) {
                    throw new Unavailable(ep + ": no HelloOk within " + o.connectTimeoutMs() + " ms", null);
                }
                int n = t.read(buf, left);
                if (n < 0) {
                    throw new Unavailable(ep + ": the server closed the connection during the hello", null);
                }
                if (first == null) {
                    first = java.util.Arrays.copyOf(buf, Math.min(n, 16));
                }
                d.feed(buf, 0, n);
            }
        } catch (IOException e) {
            closeQuietly(t);
            throw new Unavailable(ep + ": hello failed: " + e.getMessage(), e);
        } catch (Unavailable | ServerError | RuntimeException e) {
            closeQuietly(t);
            throw e;
        }
    }

    private static String peerGuess(byte[] first) {
        String s = new String(first, java.nio.charset.StandardCharsets.ISO_8859_1);
        if (s.startsWith("HTTP/")) {
            return "; it looks like an HTTP server";
        }
        if (first.length > 0 && first[0] == 0x16) {
            return "; it looks like a TLS server (use tls:host:port)";
        }
        if (first.length > 0 && first[0] == 'N' || s.startsWith("E")) {
            return "; it looks like a PostgreSQL server";
        }
        return "; its first bytes: " + java.util.HexFormat.of().formatHex(first);
    }

    private static void closeQuietly(Transport t) {
        try {
            t.close();
        } catch (IOException ignored) {
            // nothing to do
        }
    }

    boolean broken() {
        return broken || closed;
    }

    /** The next transaction's global Xid (sequence 1, 2, 3, ... within the session). */
    DecreeXid nextXid() {
        return DecreeXid.of(node, incarnation, session, sequence.incrementAndGet());
    }

    boolean owns(DecreeXid xid) {
        return xid.isDecree() && xid.node() == node && xid.incarnation() == incarnation && xid.session() == session;
    }

    private void send(byte[] frame) throws IOException {
        byte[] out = frame;
        if (bufferedCount > 0) {
            buffered.writeBytes(frame);
            out = buffered.toByteArray();
            buffered.reset();
            bufferedCount = 0;
        }
        lastSentNanos = System.nanoTime();
        transport.write(out);
    }

    private void markBroken(String why) {
        if (!broken) {
            broken = true;
            log.debug("{}: session {} is broken: {}", endpoint, Long.toUnsignedString(session), why);
        }
        closeQuietly(transport);
    }

    /**
     * Whether the session is still open, without blocking (docs/protocol.md, "What a client
     * does", step 5): the end of the stream, a reset, or a frame the server sent on its own
     * (an error before it closes) means it is gone.
     */
    boolean alive() {
        lock.lock();
        try {
            if (broken()) {
                return false;
            }
            try {
                int n = transport.readNow(readBuf);
                if (n < 0) {
                    markBroken("the server closed the session");
                    return false;
                }
                if (n > 0) {
                    decoder.feed(readBuf, 0, n);
                    Frame f = decoder.next();
                    markBroken("the server sent " + (f == null ? "part of a frame" : f.message()) + " unasked");
                    return false;
                }
                return true;
            } catch (IOException | FrameException e) {
                markBroken(e.getMessage());
                return false;
            }
        } finally {
            lock.unlock();
        }
    }

    private Frame await(long request, String what) throws LostReply {
        long timeout = options.replyTimeoutMs();
        try {
            while (true) {
                Frame f = decoder.next();
                if (f != null) {
                    if (Protocol.unknownMustUnderstand(f.trailer(), Set.of()) != null) {
                        markBroken("a must-understand field this client does not know");
                        throw new LostReply(what + ": the server's answer carries a must-understand field this client does not know", null);
                    }
                    if (f.requestId() == request) {
                        return f;
                    }
                    if (f.message() instanceof Message.Error e && f.requestId() == 0) {
                        markBroken("error " + e.code());
                        throw new LostReply(what + ": the server closed the session: error " + e.code() + " " + e.message(), null);
                    }
                    markBroken("an answer to request " + f.requestId() + " while waiting for " + request);
                    throw new LostReply(what + ": an answer to another request (" + f.requestId() + ")", null);
                }
                int n = transport.read(readBuf, timeout);
                if (n < 0) {
                    markBroken("end of stream");
                    throw new LostReply(what + ": the server closed the connection before answering", null);
                }
                decoder.feed(readBuf, 0, n);
            }
        } catch (IOException | FrameException e) {
            markBroken(e.getMessage());
            throw new LostReply(what + ": no answer: " + e.getMessage(), e);
        }
    }

    private ServerError error(Message.Error e) {
        if (!ErrorCodes.keepsConnection(e.code())) {
            markBroken("error " + e.code());
        }
        return new ServerError(e.code(), e.message());
    }

    /**
     * Sends the decision, after checking that the session is still open. NotSent: the
     * decision was not written whole (roll back); ServerError: refused or LogFailed;
     * LostReply: written, answer lost (resolve with Outcome).
     */
    void decide(DecreeXid xid, List<Branch> branches) throws NotSent, ServerError, LostReply {
        lock.lock();
        try {
            Protocol.checkDecision(xid, branches);
            byte[] frame = Protocol.encodeFrame(requestId, new Message.Decide(xid, branches));
            if (frame.length > frameBytesMax) {
                throw new IllegalArgumentException("the decision of " + frame.length + " bytes exceeds the server's frame_bytes_max " + frameBytesMax);
            }
            if (!alive()) {
                throw new NotSent("the session was closed by the server before the decision was sent", null);
            }
            long request = requestId++;
            try {
                send(frame);
            } catch (IOException e) {
                markBroken(e.getMessage());
                throw new NotSent("the decision could not be written: " + e.getMessage(), e);
            }
            Hooks.step("decide-sent", xid);
            Frame f = await(request, "Decide");
            if (f.message() instanceof Message.DecideOk) {
                return;
            }
            if (f.message() instanceof Message.Error e) {
                throw error(e);
            }
            markBroken("unexpected " + f.message());
            throw new LostReply("Decide: unexpected answer " + f.message(), null);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Writes the {@code OnePhase} notice at once (with any buffered completions) on a version-3
     * session and returns true once the whole frame is written; false on older sessions, which
     * are not told. NotSent: the frame was not written (roll the branch back).
     */
    boolean onePhase(DecreeXid xid) throws NotSent {
        lock.lock();
        try {
            if (version < 3) {
                return false;
            }
            if (broken()) {
                throw new NotSent("the session is closed", null);
            }
            try {
                send(Protocol.encodeFrame(requestId++, new Message.OnePhase(xid)));
                return true;
            } catch (IOException e) {
                markBroken(e.getMessage());
                throw new NotSent("the OnePhase notice could not be written: " + e.getMessage(), e);
            }
        } finally {
            lock.unlock();
        }
    }

    /** Buffers {@code Complete} (or {@code CompleteHeuristic}); sent with the next request, a ping, or at close. */
    void complete(DecreeXid xid, Heuristic heuristic) {
        lock.lock();
        try {
            if (broken()) {
                return;
            }
            Message m = heuristic == null || version < 2 ? new Message.Complete(xid) : new Message.CompleteHeuristic(xid, heuristic);
            buffered.writeBytes(Protocol.encodeFrame(requestId++, m));
            bufferedCount++;
            if (bufferedCount >= COMPLETES_BUFFERED_MAX) {
                flush();
            }
        } finally {
            lock.unlock();
        }
    }

    /**
     * Reports {@code xid}'s heuristic outcome and says whether the server keeps it for good,
     * after which (and only after which) the resource managers may forget the heuristic
     * branches (docs/protocol.md, "The kept-reply field"). On a version-3 session the
     * {@code CompleteHeuristic} carries the kept-reply field and is sent at once (with any
     * buffered completions) and its answer awaited: {@code OutcomeIs} heuristic is true.
     * NotKept, MustUnderstand (a version-3 server that predates the field), any other error,
     * a lost answer or a broken session are false: the branches are left to the server's
     * recovery, which reports them again. On older sessions the plain notice is buffered as
     * before and the answer is false: such a client never forgets a heuristic branch itself.
     */
    boolean completeKept(DecreeXid xid, Heuristic heuristic) {
        lock.lock();
        try {
            if (version < Protocol.TRAILER_VERSION) {
                complete(xid, heuristic);
                return false;
            }
            if (broken()) {
                log.warn("{}: heuristic outcome {} not reported: the session is closed; its branches are left to the server's recovery",
                        xid, heuristic);
                return false;
            }
            long request = requestId++;
            try {
                send(Protocol.encodeFrame(request, new Message.CompleteHeuristic(xid, heuristic),
                        List.of(new Message.Field(Protocol.REPLY_WHEN_KEPT, new byte[0]))));
            } catch (IOException e) {
                markBroken(e.getMessage());
                log.warn("{}: heuristic outcome {} not reported ({}); its branches are left to the server's recovery", xid, heuristic,
                        e.getMessage());
                return false;
            }
            Frame f;
            try {
                f = await(request, "CompleteHeuristic");
            } catch (LostReply e) {
                log.warn("{}: no answer to the heuristic report ({}); its branches are left to the server's recovery", xid, e.getMessage());
                return false;
            }
            if (f.message() instanceof Message.OutcomeIs o && o.outcome() == Outcome.HEURISTIC) {
                return true;
            }
            if (f.message() instanceof Message.Error e) {
                if (e.code() != ErrorCodes.NOT_KEPT && e.code() != ErrorCodes.MUST_UNDERSTAND) {
                    error(e); // closes the session when the code says the server did.
                }
                log.warn("{}: the server did not keep the heuristic outcome {} (error {} {}: {}); its branches are left to the "
                        + "server's recovery", xid, heuristic, e.code(), ErrorCodes.name(e.code()), e.message());
                return false;
            }
            markBroken("unexpected " + f.message());
            log.warn("{}: unexpected answer {} to the heuristic report; its branches are left to the server's recovery", xid, f.message());
            return false;
        } finally {
            lock.unlock();
        }
    }

    /** Sends the buffered completions now. */
    void flush() {
        lock.lock();
        try {
            if (bufferedCount == 0 || broken()) {
                return;
            }
            byte[] out = buffered.toByteArray();
            buffered.reset();
            bufferedCount = 0;
            try {
                lastSentNanos = System.nanoTime();
                transport.write(out);
            } catch (IOException e) {
                markBroken(e.getMessage());
            }
        } finally {
            lock.unlock();
        }
    }

    /** Asks what became of {@code xid} (session rule 6); version 1's errors 15 and 16 read as unknown and heuristic. */
    Outcome outcome(DecreeXid xid) throws ServerError, LostReply, NotSent {
        lock.lock();
        try {
            long request = requestId++;
            try {
                send(Protocol.encodeFrame(request, new Message.OutcomeQuery(xid)));
            } catch (IOException e) {
                markBroken(e.getMessage());
                throw new NotSent("Outcome could not be written: " + e.getMessage(), e);
            }
            Frame f = await(request, "Outcome");
            if (f.message() instanceof Message.OutcomeIs o) {
                return o.outcome();
            }
            if (f.message() instanceof Message.Error e) {
                if (e.code() == ErrorCodes.OUTCOME_UNKNOWN) {
                    return Outcome.UNKNOWN;
                }
                if (e.code() == ErrorCodes.OUTCOME_HEURISTIC) {
                    return Outcome.HEURISTIC;
                }
                throw error(e);
            }
            markBroken("unexpected " + f.message());
            throw new LostReply("Outcome: unexpected answer " + f.message(), null);
        } finally {
            lock.unlock();
        }
    }

    void ping() throws ServerError, LostReply, NotSent {
        lock.lock();
        try {
            long request = requestId++;
            try {
                send(Protocol.encodeFrame(request, new Message.Ping()));
            } catch (IOException e) {
                markBroken(e.getMessage());
                throw new NotSent("Ping could not be written: " + e.getMessage(), e);
            }
            Frame f = await(request, "Ping");
            if (f.message() instanceof Message.Error e) {
                throw error(e);
            }
        } finally {
            lock.unlock();
        }
    }

    /** Pings when nothing was sent for {@code idleMs} and nobody uses the session (keep-alive). */
    void pingIfIdle(long idleMs) {
        if (broken() || !lock.tryLock()) {
            return;
        }
        try {
            if ((System.nanoTime() - lastSentNanos) / 1_000_000 >= idleMs) {
                ping();
            }
        } catch (DecreeException e) {
            log.debug("{}: keep-alive ping failed: {}", endpoint, e.getMessage());
        } finally {
            lock.unlock();
        }
    }

    /** Sends the buffered completions, then closes the connection (the server finishes what this session decided). */
    @Override
    public void close() {
        if (closed) {
            return;
        }
        flush();
        closed = true;
        closeQuietly(transport);
    }

    /** Closes without sending anything (a lost answer: the close is what lets the server answer Outcome). */
    void closeNow(String why) {
        log.debug("{}: closing session {}: {}", endpoint, Long.toUnsignedString(session), why);
        buffered.reset();
        bufferedCount = 0;
        closed = true;
        closeQuietly(transport);
    }

    @Override
    public String toString() {
        return endpoint + " session " + Long.toUnsignedString(session) + " (v" + version + ")";
    }
}
