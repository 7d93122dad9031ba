package dev.decree.jta;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** A small JSON reader for the vector files (objects, arrays, strings, integers, booleans, null). */
final class Json {
    private final String s;
    private int at;

    private Json(String s) {
        this.s = s;
    }

    static Object parse(String text) {
        Json j = new Json(text);
        Object v = j.value();
        j.ws();
        if (j.at != text.length()) {
            throw new IllegalArgumentException("trailing text at " + j.at);
        }
        return v;
    }

    @SuppressWarnings("unchecked")
    static Map<String, Object> obj(Object o) {
        return (Map<String, Object>) o;
    }

    @SuppressWarnings("unchecked")
    static List<Object> list(Object o) {
        return (List<Object>) o;
    }

    /** A JSON integer as a long (u64 values above 2^63 wrap, as the wire's u64 do). */
    static long num(Object o) {
        return ((BigInteger) o).longValue();
    }

    private void ws() {
        while (at < s.length() && Character.isWhitespace(s.charAt(at))) {
            at++;
        }
    }

    private Object value() {
        ws();
        char c = s.charAt(at);
        switch (c) {
            case '{' -> {
                at++;
                Map<String, Object> m = new LinkedHashMap<>();
                ws();
                if (s.charAt(at) == '}') {
                    at++;
                    return m;
                }
                while (true) {
                    ws();
                    String k = string();
                    ws();
                    expect(':');
                    m.put(k, value());
                    ws();
                    if (s.charAt(at) == ',') {
                        at++;
                        continue;
                    }
                    expect('}');
                    return m;
                }
            }
            case '[' -> {
                at++;
                List<Object> l = new ArrayList<>();
                ws();
                if (s.charAt(at) == ']') {
                    at++;
                    return l;
                }
                while (true) {
                    l.add(value());
                    ws();
                    if (s.charAt(at) == ',') {
                        at++;
                        continue;
                    }
                    expect(']');
                    return l;
                }
            }
            case '"' -> {
                return string();
            }
            default -> {
                if (s.startsWith("true", at)) {
                    at += 4;
                    return Boolean.TRUE;
                }
                if (s.startsWith("false", at)) {
                    at += 5;
                    return Boolean.FALSE;
                }
                if (s.startsWith("null", at)) {
                    at += 4;
                    return null;
                }
                int start = at;
                while (at < s.length() && "+-0123456789.eE".indexOf(s.charAt(at)) >= 0) {
                    at++;
                }
                String n = s.substring(start, at);
                if (n.contains(".") || n.contains("e") || n.contains("E")) {
                    return new BigDecimal(n);
                }
                return new BigInteger(n);
            }
        }
    }

    private void expect(char c) {
        if (s.charAt(at) != c) {
            throw new IllegalArgumentException("expected " + c + " at " + at);
        }
        at++;
    }

    private String string() {
        expect('"');
        StringBuilder b = new StringBuilder();
        while (true) {
            char c = s.charAt(at++);
            if (c == '"') {
                return b.toString();
            }
            if (c == '\\') {
                char e = s.charAt(at++);
                switch (e) {
                    case 'n' -> b.append('\n');
                    case 't' -> b.append('\t');
                    case 'r' -> b.append('\r');
                    case 'b' -> b.append('\b');
                    case 'f' -> b.append('\f');
                    case 'u' -> {
                        b.append((char) Integer.parseInt(s.substring(at, at + 4), 16));
                        at += 4;
                    }
                    default -> b.append(e);
                }
            } else {
                b.append(c);
            }
        }
    }
}
