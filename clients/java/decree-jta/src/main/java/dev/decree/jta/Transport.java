package dev.decree.jta;

import java.io.Closeable;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.SocketTimeoutException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.SocketChannel;
import java.nio.file.Path;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLSocket;

/** A byte stream to the server: a Unix or TCP socket channel, or a TLS socket. */
abstract class Transport implements Closeable {
    /** Writes all of {@code data}; IOException if any byte could not be written. */
    abstract void write(byte[] data) throws IOException;

    /** Blocks up to {@code timeoutMs} (0: no bound) for bytes; the count, -1 at the end of the stream. */
    abstract int read(byte[] buf, long timeoutMs) throws IOException;

    /** Reads what is there without blocking: the count, 0 when nothing is, -1 at the end of the stream. */
    abstract int readNow(byte[] buf) throws IOException;

    static Transport open(Endpoint ep, SessionOptions o) throws IOException {
        return switch (ep.scheme()) {
            case "unix" -> ChannelTransport.connect(SocketChannel.open(StandardProtocolFamily.UNIX),
                    UnixDomainSocketAddress.of(Path.of(ep.path())), o.connectTimeoutMs());
            case "tcp" -> {
                InetSocketAddress a = new InetSocketAddress(ep.host(), ep.port());
                SocketChannel c = SocketChannel.open();
                c.socket().setTcpNoDelay(true);
                yield ChannelTransport.connect(c, a, o.connectTimeoutMs());
            }
            case "tls" -> TlsTransport.connect(ep, o);
            default -> throw new IOException("unknown endpoint scheme " + ep.scheme());
        };
    }

    /**
     * A socket channel kept non-blocking, waited on with a selector (poll), never asleep in
     * read(2): docs/protocol.md's implementation note on the Unix socket's spurious wake-ups.
     */
    static final class ChannelTransport extends Transport {
        private final SocketChannel ch;
        private final Selector selector;

        private ChannelTransport(SocketChannel ch) throws IOException {
            this.ch = ch;
            ch.configureBlocking(false);
            this.selector = Selector.open();
        }

        static ChannelTransport connect(SocketChannel ch, java.net.SocketAddress address, long timeoutMs) throws IOException {
            try {
                ChannelTransport t = new ChannelTransport(ch);
                if (!ch.connect(address)) {
                    SelectionKey k = ch.register(t.selector, SelectionKey.OP_CONNECT);
                    long deadline = System.nanoTime() + timeoutMs * 1_000_000;
                    while (!ch.finishConnect()) {
                        long left = (deadline - System.nanoTime()) / 1_000_000;
                        if (left <= 0) {
                            throw new SocketTimeoutException("connect to " + address + " timed out after " + timeoutMs + " ms");
                        }
                        t.selector.select(left);
                        t.selector.selectedKeys().clear();
                    }
                    k.cancel();
                    t.selector.selectNow();
                }
                return t;
            } catch (IOException | RuntimeException e) {
                ch.close();
                throw e;
            }
        }

        @Override
        void write(byte[] data) throws IOException {
            ByteBuffer b = ByteBuffer.wrap(data);
            while (b.hasRemaining()) {
                if (ch.write(b) == 0) {
                    SelectionKey k = ch.register(selector, SelectionKey.OP_WRITE);
                    selector.select(1000);
                    selector.selectedKeys().clear();
                    k.interestOps(0);
                }
            }
        }

        @Override
        int read(byte[] buf, long timeoutMs) throws IOException {
            ByteBuffer b = ByteBuffer.wrap(buf);
            long deadline = timeoutMs > 0 ? System.nanoTime() + timeoutMs * 1_000_000 : Long.MAX_VALUE;
            while (true) {
                int n = ch.read(b);
                if (n != 0) {
                    return n;
                }
                long left = timeoutMs > 0 ? (deadline - System.nanoTime()) / 1_000_000 : 0;
                if (timeoutMs > 0 && left <= 0) {
                    throw new SocketTimeoutException("no answer within " + timeoutMs + " ms");
                }
                SelectionKey k = ch.register(selector, SelectionKey.OP_READ);
                selector.select(timeoutMs > 0 ? Math.max(1, left) : 0);
                selector.selectedKeys().clear();
                k.interestOps(0);
            }
        }

        @Override
        int readNow(byte[] buf) throws IOException {
            return ch.read(ByteBuffer.wrap(buf));
        }

        @Override
        public void close() throws IOException {
            try {
                selector.close();
            } finally {
                ch.close();
            }
        }
    }

    /** TLS 1.3 over TCP with a client certificate (docs/protocol.md, "TLS"). */
    static final class TlsTransport extends Transport {
        private final SSLSocket socket;
        private final InputStream in;
        private final OutputStream out;

        private TlsTransport(SSLSocket socket) throws IOException {
            this.socket = socket;
            this.in = socket.getInputStream();
            this.out = socket.getOutputStream();
        }

        static TlsTransport connect(Endpoint ep, SessionOptions o) throws IOException {
            SSLContext ctx = o.sslContext();
            if (ctx == null) {
                throw new IOException(ep + ": a tls: endpoint needs TLS settings (a CA, a client certificate and its key)");
            }
            java.net.Socket raw = new java.net.Socket();
            try {
                raw.setTcpNoDelay(true);
                raw.connect(new InetSocketAddress(ep.host(), ep.port()), (int) o.connectTimeoutMs());
                SSLSocket s = (SSLSocket) ctx.getSocketFactory().createSocket(raw, ep.host(), ep.port(), true);
                SSLParameters p = s.getSSLParameters();
                p.setProtocols(new String[] {"TLSv1.3"});
                p.setEndpointIdentificationAlgorithm("HTTPS");
                s.setSSLParameters(p);
                s.setSoTimeout((int) o.connectTimeoutMs());
                s.startHandshake();
                s.setSoTimeout(0);
                return new TlsTransport(s);
            } catch (IOException | RuntimeException e) {
                raw.close();
                throw e;
            }
        }

        @Override
        void write(byte[] data) throws IOException {
            out.write(data);
            out.flush();
        }

        @Override
        int read(byte[] buf, long timeoutMs) throws IOException {
            socket.setSoTimeout((int) Math.min(Integer.MAX_VALUE, timeoutMs));
            int n = in.read(buf);
            return n;
        }

        @Override
        int readNow(byte[] buf) throws IOException {
            if (in.available() > 0) {
                return in.read(buf, 0, Math.min(buf.length, in.available()));
            }
            socket.setSoTimeout(1);
            try {
                return in.read(buf);
            } catch (SocketTimeoutException e) {
                return 0;
            } finally {
                socket.setSoTimeout(0);
            }
        }

        @Override
        public void close() throws IOException {
            socket.close();
        }
    }

    static EOFException eof() {
        return new EOFException("the server closed the connection");
    }
}
