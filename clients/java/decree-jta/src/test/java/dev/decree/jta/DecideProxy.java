package dev.decree.jta;

import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;

/**
 * A Unix-socket proxy in front of a pair member that loses the first {@code Decide} sent
 * through it once armed: {@code holdReply} lets the Decide reach the member and swallows its
 * answer (the member decided; the client never hears it); otherwise the Decide itself is
 * held back (the member never hears it). Nothing passes on that connection after it; when
 * the member dies, every connection through the proxy is closed, as the member's own would
 * be.
 */
final class DecideProxy implements AutoCloseable {
    private final Path upstream;
    final Path path;
    private final boolean holdReply;
    volatile boolean armed;
    final CountDownLatch lost = new CountDownLatch(1);
    private volatile long decideId = -1;
    private final ServerSocketChannel listener;
    private final List<SocketChannel> sockets = new CopyOnWriteArrayList<>();

    DecideProxy(Path upstream, Path path, boolean holdReply) throws IOException {
        this.upstream = upstream;
        this.path = path;
        this.holdReply = holdReply;
        Files.deleteIfExists(path);
        listener = ServerSocketChannel.open(StandardProtocolFamily.UNIX);
        listener.bind(UnixDomainSocketAddress.of(path));
        Thread t = new Thread(this::accept, "decide-proxy");
        t.setDaemon(true);
        t.start();
    }

    String endpoint() {
        return "unix:" + path;
    }

    private void accept() {
        while (true) {
            SocketChannel down;
            try {
                down = listener.accept();
            } catch (IOException e) {
                return;
            }
            SocketChannel up;
            try {
                up = SocketChannel.open(StandardProtocolFamily.UNIX);
                up.connect(UnixDomainSocketAddress.of(upstream));
            } catch (IOException e) {
                close(down); // the member is gone: so is every connection to it.
                continue;
            }
            sockets.add(up);
            sockets.add(down);
            start(() -> pump(down, up, true));
            start(() -> pump(up, down, false));
        }
    }

    private static void start(Runnable r) {
        Thread t = new Thread(r, "decide-proxy-pump");
        t.setDaemon(true);
        t.start();
    }

    private static boolean readFully(SocketChannel ch, ByteBuffer b) throws IOException {
        while (b.hasRemaining()) {
            if (ch.read(b) < 0) {
                return false;
            }
        }
        return true;
    }

    private void pump(SocketChannel src, SocketChannel dst, boolean toServer) {
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

    private static void close(SocketChannel c) {
        try {
            c.close();
        } catch (IOException ignored) {
            // gone already
        }
    }

    /** Closes every connection through the proxy (the member died). */
    void memberDied() {
        for (SocketChannel s : sockets) {
            close(s);
        }
    }

    @Override
    public void close() throws IOException {
        listener.close();
        memberDied();
        Files.deleteIfExists(path);
    }
}
