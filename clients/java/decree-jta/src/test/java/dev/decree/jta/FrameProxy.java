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

/**
 * A Unix-socket proxy in front of a real {@code decree serve}: each client connection gets one
 * to the server and two pump threads, which a subclass writes (what passes, what is changed,
 * answered or held back). When the server cannot be reached the client's connection is closed.
 */
abstract class FrameProxy implements AutoCloseable {
    private final Path upstream;
    final Path path;
    private final String name;
    private final ServerSocketChannel listener;
    private final List<SocketChannel> sockets = new CopyOnWriteArrayList<>();

    FrameProxy(Path upstream, Path path, String name) throws IOException {
        this.upstream = upstream;
        this.path = path;
        this.name = name;
        Files.deleteIfExists(path);
        listener = ServerSocketChannel.open(StandardProtocolFamily.UNIX);
        listener.bind(UnixDomainSocketAddress.of(path));
    }

    /** Starts accepting: called by the subclass's constructor once its own fields are set. */
    final void listen() {
        Thread t = new Thread(this::accept, name);
        t.setDaemon(true);
        t.start();
    }

    String endpoint() {
        return "unix:" + path;
    }

    /** Moves frames from {@code src} to {@code dst} ({@code toServer}: client to server) until a side closes. */
    abstract void pump(SocketChannel src, SocketChannel dst, boolean toServer);

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
                close(down); // the server is gone: so is every connection to it.
                continue;
            }
            sockets.add(up);
            sockets.add(down);
            start(() -> pump(down, up, true));
            start(() -> pump(up, down, false));
        }
    }

    private void start(Runnable r) {
        Thread t = new Thread(r, name + "-pump");
        t.setDaemon(true);
        t.start();
    }

    static boolean readFully(SocketChannel ch, ByteBuffer b) throws IOException {
        while (b.hasRemaining()) {
            if (ch.read(b) < 0) {
                return false;
            }
        }
        return true;
    }

    static void close(SocketChannel c) {
        try {
            c.close();
        } catch (IOException ignored) {
            // gone already
        }
    }

    /** Closes every connection through the proxy. */
    void closeConnections() {
        for (SocketChannel s : sockets) {
            close(s);
        }
    }

    @Override
    public void close() throws IOException {
        listener.close();
        closeConnections();
        Files.deleteIfExists(path);
    }
}
