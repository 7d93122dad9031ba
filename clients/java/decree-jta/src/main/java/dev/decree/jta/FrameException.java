package dev.decree.jta;

/**
 * A frame that cannot be read: {@link #kind()} is one of the error names of
 * docs/vectors/messages.json ({@code TooLarge}, {@code TooShort}, {@code Version},
 * {@code UnknownType}, {@code Malformed}). After it the byte stream cannot be resumed.
 */
public final class FrameException extends Exception {
    private final String kind;

    public FrameException(String kind, String message) {
        super(kind + ": " + message);
        this.kind = kind;
    }

    static FrameException malformed(String message) {
        return new FrameException("Malformed", message);
    }

    public String kind() {
        return kind;
    }
}
