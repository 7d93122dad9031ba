package dev.decree.jta;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;

/**
 * A Unix-socket proxy in front of a real {@code decree serve} that plays the servers issue 32
 * must be safe with. {@link Mode#VERSION_2}: every Hello offers versions 1 and 2 only, so the
 * real server speaks version 2 (no trailer, no kept reply). {@link Mode#NOT_KEPT} and
 * {@link Mode#MUST_UNDERSTAND}: a {@code CompleteHeuristic} carrying the kept-reply field never
 * reaches the server; the proxy answers it with Error 21 (a server that could not keep the
 * outcome) or Error 20 (a version-3 server that predates the field and acts on nothing of
 * it). Everything else passes unchanged. {@link #completeHeuristics} lists the
 * {@code CompleteHeuristic} frames the client sent, with their trailers.
 */
final class KeptProxy extends FrameProxy {
    enum Mode { VERSION_2, NOT_KEPT, MUST_UNDERSTAND }

    private final Mode mode;
    /** Each CompleteHeuristic the client sent: its heuristic and whether it asked for the kept reply. */
    final List<String> completeHeuristics = new CopyOnWriteArrayList<>();

    KeptProxy(Path upstream, Path path, Mode mode) throws IOException {
        super(upstream, path, "kept-proxy");
        this.mode = mode;
        listen();
    }

    private static void write(SocketChannel ch, byte[] frame) throws IOException {
        synchronized (ch) { // both pumps may answer the client.
            ByteBuffer b = ByteBuffer.wrap(frame);
            while (b.hasRemaining()) {
                ch.write(b);
            }
        }
    }

    @Override
    void pump(SocketChannel src, SocketChannel dst, boolean toServer) {
        try {
            while (true) {
                ByteBuffer len = ByteBuffer.allocate(4);
                if (!readFully(src, len)) {
                    break;
                }
                int n = len.getInt(0);
                ByteBuffer rest = ByteBuffer.allocate(n);
                if (!readFully(src, rest)) {
                    break;
                }
                byte[] frame = ByteBuffer.allocate(4 + n).put(len.array()).put(rest.array()).array();
                int type = frame[5] & 0xff;
                long request = ByteBuffer.wrap(frame, 6, 8).getLong();
                byte[] body = java.util.Arrays.copyOfRange(frame, Protocol.HEADER_BYTES, frame.length);
                if (toServer && type == Message.HELLO && mode == Mode.VERSION_2) {
                    Message.Hello h = (Message.Hello) Protocol.decodeMessage(type, body, 1).message();
                    frame = Protocol.encodeFrame(request, new Message.Hello(h.nodeExpected(), h.client(), List.of(1, 2)));
                } else if (toServer && type == Message.COMPLETE_HEURISTIC) {
                    Protocol.Decoded d = Protocol.decodeMessage(type, body, 3);
                    boolean kept = d.trailer().stream().anyMatch(f -> f.tag() == Protocol.REPLY_WHEN_KEPT);
                    completeHeuristics.add(((Message.CompleteHeuristic) d.message()).heuristic() + (kept ? " kept" : ""));
                    if (kept && mode == Mode.NOT_KEPT) {
                        write(src, Protocol.encodeFrame(request, new Message.Error(ErrorCodes.NOT_KEPT,
                                "the heuristic outcome is not kept: leave its branches to recovery")));
                        continue;
                    }
                    if (kept && mode == Mode.MUST_UNDERSTAND) {
                        write(src, Protocol.encodeFrame(request, new Message.Error(ErrorCodes.MUST_UNDERSTAND,
                                "CompleteHeuristic carries must-understand field 0x8002, which this server does not know")));
                        continue;
                    }
                }
                write(dst, frame);
            }
        } catch (IOException | FrameException e) {
            // a side closed
        }
        close(dst);
        close(src);
    }
}
