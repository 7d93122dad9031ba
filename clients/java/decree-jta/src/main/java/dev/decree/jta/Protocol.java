package dev.decree.jta;

import dev.decree.jta.Message.Branch;
import dev.decree.jta.Message.Complete;
import dev.decree.jta.Message.CompleteHeuristic;
import dev.decree.jta.Message.Decide;
import dev.decree.jta.Message.DecideOk;
import dev.decree.jta.Message.Error;
import dev.decree.jta.Message.Field;
import dev.decree.jta.Message.Frame;
import dev.decree.jta.Message.Hello;
import dev.decree.jta.Message.HelloOk;
import dev.decree.jta.Message.Negotiated;
import dev.decree.jta.Message.OnePhase;
import dev.decree.jta.Message.OutcomeIs;
import dev.decree.jta.Message.OutcomeQuery;
import dev.decree.jta.Message.Ping;
import dev.decree.jta.Message.Pong;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

/**
 * The frames of docs/protocol.md: encoding ({@link #encodeFrame}) and decoding
 * ({@link #decodeMessage}, {@link Decoder}), checked against docs/vectors/messages.json in
 * both directions by the tests. All integers big-endian.
 */
public final class Protocol {
    private Protocol() {}

    public static final int FRAME_VERSION = 1;
    /** The protocol versions this client speaks, offered in every Hello. */
    public static final List<Integer> PROTOCOL_VERSIONS = List.of(1, 2, 3);
    public static final int FRAME_BYTES_MAX = 65536;
    public static final int HEADER_BYTES = 14;
    public static final int BRANCHES_MAX = 512;
    public static final int RM_NAME_BYTES_MAX = 64;
    public static final int CLIENT_NAME_BYTES_MAX = 255;
    public static final int HELLO_VERSIONS_MAX = 16;
    /** The first protocol version whose messages may carry a field trailer. */
    public static final int TRAILER_VERSION = 3;
    /**
     * The kept-reply field (must understand, empty value), on {@code CompleteHeuristic} of a
     * version-3 session only: the server answers {@code OutcomeIs} heuristic once it keeps
     * the outcome, or {@code Error} 21 NotKept (docs/protocol.md, "The kept-reply field").
     */
    public static final int REPLY_WHEN_KEPT = 0x8002;
    static final byte[] DECISION_MAGIC = {'D', 'C', 'D', '1'};

    // --- encoding --------------------------------------------------------------------------

    /** The whole frame of {@code m} with {@code requestId} and no trailer. */
    public static byte[] encodeFrame(long requestId, Message m) {
        return encodeFrame(requestId, m, List.of());
    }

    /**
     * The whole frame of {@code m}, followed by a version-3 field {@code trailer} when one is
     * given (send one only on a session of version 3 or later).
     */
    public static byte[] encodeFrame(long requestId, Message m, List<Field> trailer) {
        byte[] body = encodeBody(m);
        byte[] tail = trailer.isEmpty() ? new byte[0] : encodeTrailer(m, trailer);
        int length = HEADER_BYTES - 4 + body.length + tail.length;
        ByteBuffer b = ByteBuffer.allocate(4 + length);
        b.putInt(length).put((byte) FRAME_VERSION).put((byte) m.type()).putLong(requestId).put(body).put(tail);
        return b.array();
    }

    static byte[] encodeTrailer(Message m, List<Field> trailer) {
        if (m instanceof Hello || m instanceof Error) {
            throw new IllegalArgumentException(m.getClass().getSimpleName() + " carries no field trailer");
        }
        if (m instanceof HelloOk h && h.version() < TRAILER_VERSION) {
            throw new IllegalArgumentException("a HelloOk carries a field trailer only when it chose version 3 or later");
        }
        Set<Integer> tags = new HashSet<>();
        int size = 0;
        for (Field f : trailer) {
            if (!tags.add(f.tag())) {
                throw new IllegalArgumentException("each tag at most once in a trailer");
            }
            if (f.tag() < 0 || f.tag() > 0xffff || f.value().length > 0xffff) {
                throw new IllegalArgumentException("a field's tag and length are u16");
            }
            size += 4 + f.value().length;
        }
        ByteBuffer b = ByteBuffer.allocate(size);
        for (Field f : trailer) {
            byte[] v = f.value();
            b.putShort((short) f.tag()).putShort((short) v.length).put(v);
        }
        return b.array();
    }

    /** {@code text} as UTF-8, cut on a character boundary to at most {@code limit} bytes. */
    static byte[] utf8Cut(String text, int limit) {
        byte[] all = text.getBytes(StandardCharsets.UTF_8);
        if (all.length <= limit) {
            return all;
        }
        int end = limit;
        while (end > 0 && (all[end] & 0xc0) == 0x80) {
            end--;
        }
        byte[] out = new byte[end];
        System.arraycopy(all, 0, out, 0, end);
        return out;
    }

    /**
     * Checks a decision against the limits of docs/protocol.md (1 to 512 branches, distinct
     * numbers, RM names of 1 to 64 bytes, a global Xid): the server would refuse it.
     */
    public static void checkDecision(DecreeXid xid, List<Branch> branches) {
        if (xid.getBranchQualifier().length != 0) {
            throw new IllegalArgumentException("a decision names the global transaction (empty bqual), not " + xid);
        }
        if (branches.isEmpty() || branches.size() > BRANCHES_MAX) {
            throw new IllegalArgumentException("a decision has 1 to " + BRANCHES_MAX + " branches, not " + branches.size());
        }
        Set<Integer> numbers = new HashSet<>();
        for (Branch br : branches) {
            if (br.number() < 0 || br.number() > 0xffff || !numbers.add(br.number())) {
                throw new IllegalArgumentException("branch number " + br.number() + " is not a distinct u16");
            }
            int n = br.rm().getBytes(StandardCharsets.UTF_8).length;
            if (n < 1 || n > RM_NAME_BYTES_MAX) {
                throw new IllegalArgumentException("a resource manager name is 1 to 64 bytes: " + br.rm());
            }
        }
    }

    static byte[] encodeBody(Message m) {
        if (m instanceof Hello h) {
            byte[] name = utf8Cut(h.client(), CLIENT_NAME_BYTES_MAX);
            int n = 5 + name.length + (h.versions().isEmpty() ? 0 : 1 + h.versions().size());
            ByteBuffer b = ByteBuffer.allocate(n).putInt((int) h.nodeExpected()).put((byte) name.length).put(name);
            if (!h.versions().isEmpty()) {
                b.put((byte) h.versions().size());
                for (int v : h.versions()) {
                    b.put((byte) v);
                }
            }
            return b.array();
        }
        if (m instanceof HelloOk h) {
            ByteBuffer b = ByteBuffer.allocate(h.negotiated() == null ? 28 : 33);
            b.putInt((int) h.node()).putLong(h.incarnation()).putLong(h.session()).putInt((int) h.frameBytesMax())
                    .putInt((int) h.inflightMax());
            if (h.negotiated() != null) {
                b.put((byte) h.negotiated().version()).putInt((int) h.negotiated().idleTimeoutMs());
            }
            return b.array();
        }
        if (m instanceof Decide d) {
            checkDecision(d.xid(), d.branches());
            int n = 4 + d.xid().encodedLength() + 2;
            List<byte[]> names = new ArrayList<>();
            for (Branch br : d.branches()) {
                byte[] name = br.rm().getBytes(StandardCharsets.UTF_8);
                names.add(name);
                n += 3 + name.length;
            }
            ByteBuffer b = ByteBuffer.allocate(n).put(DECISION_MAGIC);
            d.xid().encodeInto(b);
            b.putShort((short) d.branches().size());
            for (int i = 0; i < names.size(); i++) {
                b.putShort((short) d.branches().get(i).number()).put((byte) names.get(i).length).put(names.get(i));
            }
            return b.array();
        }
        if (m instanceof DecideOk || m instanceof Ping || m instanceof Pong) {
            return new byte[0];
        }
        if (m instanceof Complete c) {
            return c.xid().encode();
        }
        if (m instanceof OutcomeQuery q) {
            return q.xid().encode();
        }
        if (m instanceof OnePhase o) {
            return o.xid().encode();
        }
        if (m instanceof CompleteHeuristic c) {
            ByteBuffer b = ByteBuffer.allocate(c.xid().encodedLength() + 1);
            c.xid().encodeInto(b);
            return b.put((byte) c.heuristic().code).array();
        }
        if (m instanceof OutcomeIs o) {
            return new byte[] {(byte) o.outcome().code};
        }
        if (m instanceof Error e) {
            byte[] text = e.message().getBytes(StandardCharsets.UTF_8);
            return ByteBuffer.allocate(2 + text.length).putShort((short) e.code()).put(text).array();
        }
        throw new IllegalArgumentException("unknown message " + m);
    }

    // --- decoding --------------------------------------------------------------------------

    static boolean knownType(int type) {
        return (type >= Message.HELLO && type <= Message.ONE_PHASE) || type == Message.ERROR;
    }

    static String typeName(int type) {
        return switch (type) {
            case Message.HELLO -> "Hello";
            case Message.HELLO_OK -> "HelloOk";
            case Message.DECIDE -> "Decide";
            case Message.DECIDE_OK -> "DecideOk";
            case Message.COMPLETE -> "Complete";
            case Message.OUTCOME -> "Outcome";
            case Message.OUTCOME_IS -> "OutcomeIs";
            case Message.PING -> "Ping";
            case Message.PONG -> "Pong";
            case Message.COMPLETE_HEURISTIC -> "CompleteHeuristic";
            case Message.ONE_PHASE -> "OnePhase";
            case Message.ERROR -> "Error";
            default -> String.format("type 0x%02x", type);
        };
    }

    private static String text(ByteBuffer b, int n, String what) throws FrameException {
        byte[] raw = new byte[n];
        b.get(raw);
        try {
            return StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT).decode(ByteBuffer.wrap(raw)).toString();
        } catch (CharacterCodingException e) {
            throw FrameException.malformed(what + " is not UTF-8");
        }
    }

    /** The message and field trailer of a frame of {@code type}, read as a session of {@code version} reads it. */
    public static Decoded decodeMessage(int type, byte[] body, int version) throws FrameException {
        ByteBuffer b = ByteBuffer.wrap(body);
        String name = typeName(type);
        Message m;
        switch (type) {
            case Message.HELLO -> {
                return new Decoded(decodeHello(b), List.of());
            }
            case Message.ERROR -> {
                if (body.length < 2) {
                    throw FrameException.malformed("Error: body shorter than the 2-byte code");
                }
                int code = b.getShort() & 0xffff;
                return new Decoded(new Error(code, text(b, b.remaining(), "Error: message")), List.of());
            }
            case Message.HELLO_OK -> {
                if (body.length != 28 && body.length < 33) {
                    throw FrameException.malformed("HelloOk: body is " + body.length + " bytes, expected 28, or 33 and more");
                }
                long node = b.getInt() & 0xffffffffL;
                long inc = b.getLong();
                long session = b.getLong();
                long fbm = b.getInt() & 0xffffffffL;
                long inflight = b.getInt() & 0xffffffffL;
                Negotiated neg = null;
                if (body.length > 28) {
                    neg = new Negotiated(b.get() & 0xff, b.getInt() & 0xffffffffL);
                }
                HelloOk h = new HelloOk(node, inc, session, fbm, inflight, neg);
                version = h.version();
                m = h;
            }
            case Message.DECIDE -> m = decodeDecide(b);
            case Message.DECIDE_OK -> m = new DecideOk();
            case Message.PING -> m = new Ping();
            case Message.PONG -> m = new Pong();
            case Message.COMPLETE -> m = new Complete(DecreeXid.decode(b, name));
            case Message.OUTCOME -> m = new OutcomeQuery(DecreeXid.decode(b, name));
            case Message.ONE_PHASE -> m = new OnePhase(DecreeXid.decode(b, name));
            case Message.COMPLETE_HEURISTIC -> {
                DecreeXid xid = DecreeXid.decode(b, name);
                if (!b.hasRemaining()) {
                    throw FrameException.malformed(name + ": heuristic outcome missing");
                }
                int code = b.get() & 0xff;
                Heuristic h = Heuristic.of(code);
                if (h == null) {
                    throw FrameException.malformed(name + ": unknown heuristic outcome " + code);
                }
                m = new CompleteHeuristic(xid, h);
            }
            case Message.OUTCOME_IS -> {
                if (!b.hasRemaining()) {
                    throw FrameException.malformed(name + ": empty body");
                }
                int code = b.get() & 0xff;
                Outcome o = Outcome.of(code);
                if (o == null) {
                    throw FrameException.malformed(name + ": unknown outcome " + code);
                }
                m = new OutcomeIs(o);
            }
            default -> throw new FrameException("UnknownType", name);
        }
        if (!b.hasRemaining()) {
            return new Decoded(m, List.of());
        }
        if (version < TRAILER_VERSION) {
            throw FrameException.malformed(name + ": " + b.remaining() + " trailing bytes after the body");
        }
        return new Decoded(m, decodeTrailer(name, b));
    }

    /** A decoded message and its field trailer. */
    public record Decoded(Message message, List<Field> trailer) {}

    private static Hello decodeHello(ByteBuffer b) throws FrameException {
        if (b.remaining() < 5) {
            throw FrameException.malformed("Hello: body shorter than 5 bytes");
        }
        long nodeExpected = b.getInt() & 0xffffffffL;
        int n = b.get() & 0xff;
        if (b.remaining() < n) {
            throw FrameException.malformed("Hello: client name length exceeds the body");
        }
        String client = text(b, n, "Hello: client name");
        List<Integer> versions = new ArrayList<>();
        if (b.hasRemaining()) {
            int count = b.get() & 0xff;
            if (count < 1 || count > HELLO_VERSIONS_MAX) {
                throw FrameException.malformed("Hello: version count " + count + " is not between 1 and " + HELLO_VERSIONS_MAX);
            }
            if (b.remaining() != count) {
                throw FrameException.malformed("Hello: version count " + count + " does not match the " + b.remaining() + " bytes after it");
            }
            Set<Integer> seen = new HashSet<>();
            for (int i = 0; i < count; i++) {
                int v = b.get() & 0xff;
                if (!seen.add(v)) {
                    throw FrameException.malformed("Hello: a version is offered twice");
                }
                versions.add(v);
            }
        }
        return new Hello(nodeExpected, client, versions);
    }

    private static Decide decodeDecide(ByteBuffer b) throws FrameException {
        byte[] magic = new byte[4];
        if (b.remaining() < 4) {
            throw FrameException.malformed("Decide: missing DCD1 magic");
        }
        b.get(magic);
        if (!java.util.Arrays.equals(magic, DECISION_MAGIC)) {
            throw FrameException.malformed("Decide: missing DCD1 magic");
        }
        DecreeXid xid = DecreeXid.decode(b, "Decide");
        if (b.remaining() < 2) {
            throw FrameException.malformed("Decide: branch count missing");
        }
        int count = b.getShort() & 0xffff;
        if (count > BRANCHES_MAX) {
            throw FrameException.malformed("Decide: " + count + " branches exceed BRANCHES_MAX = " + BRANCHES_MAX);
        }
        List<Branch> branches = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            if (b.remaining() < 3) {
                throw FrameException.malformed("Decide: branch truncated");
            }
            int number = b.getShort() & 0xffff;
            int n = b.get() & 0xff;
            if (n > RM_NAME_BYTES_MAX) {
                throw FrameException.malformed("Decide: resource manager name of " + n + " bytes exceeds " + RM_NAME_BYTES_MAX);
            }
            if (b.remaining() < n) {
                throw FrameException.malformed("Decide: branch name truncated");
            }
            branches.add(new Branch(number, text(b, n, "Decide: branch name")));
        }
        return new Decide(xid, branches);
    }

    private static List<Field> decodeTrailer(String name, ByteBuffer b) throws FrameException {
        List<Field> fields = new ArrayList<>();
        Set<Integer> tags = new HashSet<>();
        while (b.hasRemaining()) {
            if (b.remaining() < 4) {
                throw FrameException.malformed(name + ": a field header of " + b.remaining() + " bytes (4 needed) ends the frame");
            }
            int tag = b.getShort() & 0xffff;
            int n = b.getShort() & 0xffff;
            if (b.remaining() < n) {
                throw FrameException.malformed(String.format("%s: field 0x%04x of %d bytes overruns the frame by %d", name, tag, n,
                        n - b.remaining()));
            }
            if (!tags.add(tag)) {
                throw FrameException.malformed(String.format("%s: field 0x%04x given twice", name, tag));
            }
            byte[] v = new byte[n];
            b.get(v);
            fields.add(new Field(tag, v));
        }
        return fields;
    }

    /** The first must-understand field of {@code trailer} whose tag is not known, or null. */
    public static Field unknownMustUnderstand(List<Field> trailer, Set<Integer> known) {
        for (Field f : trailer) {
            if (f.mustUnderstand() && !known.contains(f.tag())) {
                return f;
            }
        }
        return null;
    }

    /**
     * Splits a byte stream into frames, checking each header as soon as it arrives: a length
     * above {@code frameBytesMax} after 4 bytes, a wrong version or type after 6, before the
     * body is buffered. {@link #version} is the session's protocol version (from 3 on a frame
     * may end with a field trailer).
     */
    public static final class Decoder {
        private final int frameBytesMax;
        private int version;
        private byte[] buf = new byte[4096];
        private int len;

        public Decoder(int frameBytesMax, int version) {
            this.frameBytesMax = frameBytesMax;
            this.version = version;
        }

        public void version(int version) {
            this.version = version;
        }

        public void feed(byte[] data, int off, int n) {
            if (len + n > buf.length) {
                buf = java.util.Arrays.copyOf(buf, Math.max(buf.length * 2, len + n));
            }
            System.arraycopy(data, off, buf, len, n);
            len += n;
        }

        public void feed(byte[] data) {
            feed(data, 0, data.length);
        }

        /** Bytes received and not yet returned as a frame. */
        public int buffered() {
            return len;
        }

        /** The next whole frame, or null when more bytes are needed. */
        public Frame next() throws FrameException {
            if (len < 4) {
                return null;
            }
            long length = ByteBuffer.wrap(buf, 0, 4).getInt() & 0xffffffffL;
            long frameBytes = length + 4;
            if (frameBytes > frameBytesMax) {
                throw new FrameException("TooLarge", "frame of " + frameBytes + " bytes exceeds the limit of " + frameBytesMax);
            }
            if (length < HEADER_BYTES - 4) {
                throw new FrameException("TooShort", "length " + length + " is shorter than the header");
            }
            if (len < 6) {
                return null;
            }
            if (buf[4] != FRAME_VERSION) {
                throw new FrameException("Version", "frame version " + (buf[4] & 0xff));
            }
            int type = buf[5] & 0xff;
            if (!knownType(type)) {
                throw new FrameException("UnknownType", String.format("type 0x%02x", type));
            }
            if (len < frameBytes) {
                return null;
            }
            long requestId = ByteBuffer.wrap(buf, 6, 8).getLong();
            byte[] body = java.util.Arrays.copyOfRange(buf, HEADER_BYTES, (int) frameBytes);
            System.arraycopy(buf, (int) frameBytes, buf, 0, len - (int) frameBytes);
            len -= (int) frameBytes;
            Decoded d = decodeMessage(type, body, version);
            return new Frame(requestId, d.message(), d.trailer(), (int) frameBytes);
        }
    }
}
