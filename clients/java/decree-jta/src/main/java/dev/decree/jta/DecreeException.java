package dev.decree.jta;

import java.io.IOException;

/** What a session to the server can meet; the transaction manager turns these into JTA exceptions. */
public class DecreeException extends Exception {
    public DecreeException(String message, Throwable cause) {
        super(message, cause);
    }

    public DecreeException(String message) {
        super(message);
    }

    /** The server cannot be reached (connect, hello), or it answered with an error that closes the session. */
    public static final class Unavailable extends DecreeException {
        public Unavailable(String message, Throwable cause) {
            super(message, cause);
        }
    }

    /**
     * The request was not written whole (or the session was found gone before writing it): the
     * server has not taken it. A Decide not sent is never sent again elsewhere: roll back.
     */
    public static final class NotSent extends DecreeException {
        public NotSent(String message, Throwable cause) {
            super(message, cause);
        }
    }

    /** The request was written but its answer never came (the connection broke, a timeout, a bad frame). */
    public static final class LostReply extends DecreeException {
        public LostReply(String message, Throwable cause) {
            super(message, cause);
        }
    }

    /** The server answered {@code Error} (docs/protocol.md, "Errors"). */
    public static final class ServerError extends DecreeException {
        private final int code;
        private final String serverMessage;

        public ServerError(int code, String serverMessage) {
            super("server error " + code + " (" + ErrorCodes.name(code) + "): " + serverMessage);
            this.code = code;
            this.serverMessage = serverMessage;
        }

        public int code() {
            return code;
        }

        public String serverMessage() {
            return serverMessage;
        }
    }

    static IOException io(String message) {
        return new IOException(message);
    }
}
