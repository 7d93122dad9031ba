package dev.decree.jta;

import javax.net.ssl.SSLContext;

/**
 * How sessions to the server are opened: {@code nodeExpected} 0 accepts any server; the
 * client name is logged by the server; {@code replyTimeoutMs} bounds the wait for an answer
 * (a Decide whose answer does not come in time is resolved with Outcome); {@code sslContext}
 * for {@code tls:} endpoints ({@link Tls#context}).
 */
public record SessionOptions(long nodeExpected, String clientName, long connectTimeoutMs, long replyTimeoutMs, SSLContext sslContext) {
    public static SessionOptions defaults() {
        return new SessionOptions(0, "decree-jta", 5000, 30000, null);
    }

    public SessionOptions withSslContext(SSLContext ctx) {
        return new SessionOptions(nodeExpected, clientName, connectTimeoutMs, replyTimeoutMs, ctx);
    }

    public SessionOptions withReplyTimeoutMs(long ms) {
        return new SessionOptions(nodeExpected, clientName, connectTimeoutMs, ms, sslContext);
    }

    public SessionOptions withClientName(String name) {
        return new SessionOptions(nodeExpected, name, connectTimeoutMs, replyTimeoutMs, sslContext);
    }

    public SessionOptions withNodeExpected(long node) {
        return new SessionOptions(node, clientName, connectTimeoutMs, replyTimeoutMs, sslContext);
    }
}
