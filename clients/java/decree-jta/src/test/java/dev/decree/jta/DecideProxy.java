package dev.decree.jta;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.file.Path;
import java.util.concurrent.CountDownLatch;

/**
 * A Unix-socket proxy in front of a pair member that loses the first {@code Decide} sent
 * through it once armed: {@code holdReply} lets the Decide reach the member and swallows its
 * answer (the member decided; the client never hears it); otherwise the Decide itself is
 * held back (the member never hears it). Nothing passes on that connection after it; when
 * the member dies, every connection through the proxy is closed, as the member's own would
 * be.
 */
final class DecideProxy extends FrameProxy {
    private final boolean holdReply;
    volatile boolean armed;
    final CountDownLatch lost = new CountDownLatch(1);
    private volatile long decideId = -1;

    DecideProxy(Path upstream, Path path, boolean holdReply) throws IOException {
        super(upstream, path, "decide-proxy");
        this.holdReply = holdReply;
        listen();
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
                int type = rest.get(1) & 0xff;
                long request = rest.getLong(2);
                if (toServer && armed && type == Message.DECIDE && decideId < 0) {
                    decideId = request;
                    if (!holdReply) {
                        lost.countDown();
                        return; // the Decide is held back, and nothing after it.
                    }
                } else if (!toServer && holdReply && request == decideId && decideId >= 0) {
                    lost.countDown();
                    return; // the answer is swallowed, and nothing after it.
                }
                len.flip();
                rest.flip();
                dst.write(new ByteBuffer[] {len, rest});
            }
        } catch (IOException e) {
            // a side closed
        }
        if (!toServer) {
            close(dst); // the member's end closed (it died): the client's connection closes too.
        }
        close(src);
    }

    /** Closes every connection through the proxy (the member died). */
    void memberDied() {
        closeConnections();
    }
}
