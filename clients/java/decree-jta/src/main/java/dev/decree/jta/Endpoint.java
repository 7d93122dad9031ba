package dev.decree.jta;

import java.util.ArrayList;
import java.util.List;

/**
 * Where a decree server listens: {@code unix:/path}, {@code tcp:host:port} or
 * {@code tls:host:port}. A comma-separated list names the members of a pair.
 */
public record Endpoint(String scheme, String path, String host, int port) {
    public static Endpoint parse(String text) {
        String t = text.trim();
        if (t.startsWith("unix:")) {
            String path = t.substring(5);
            if (path.isEmpty()) {
                throw new IllegalArgumentException("unix: needs a socket path: " + text);
            }
            return new Endpoint("unix", path, null, 0);
        }
        for (String scheme : new String[] {"tcp", "tls"}) {
            if (t.startsWith(scheme + ":")) {
                String rest = t.substring(scheme.length() + 1);
                int colon = rest.lastIndexOf(':');
                if (colon <= 0) {
                    throw new IllegalArgumentException(scheme + ": needs host:port: " + text);
                }
                String host = rest.substring(0, colon);
                if (host.startsWith("[") && host.endsWith("]")) {
                    host = host.substring(1, host.length() - 1);
                }
                return new Endpoint(scheme, null, host, Integer.parseInt(rest.substring(colon + 1)));
            }
        }
        if (t.startsWith("/")) {
            return new Endpoint("unix", t, null, 0);
        }
        throw new IllegalArgumentException("an endpoint is unix:/path, tcp:host:port or tls:host:port, not " + text);
    }

    public static List<Endpoint> parseList(String text) {
        List<Endpoint> out = new ArrayList<>();
        for (String part : text.split(",")) {
            if (!part.isBlank()) {
                out.add(parse(part));
            }
        }
        if (out.isEmpty()) {
            throw new IllegalArgumentException("no endpoint in " + text);
        }
        return out;
    }

    @Override
    public String toString() {
        return scheme.equals("unix") ? "unix:" + path : scheme + ":" + host + ":" + port;
    }
}
