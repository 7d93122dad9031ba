package dev.decree.jta;

import java.util.Arrays;
import java.util.List;

/**
 * The messages of docs/protocol.md ("Frames"), one record each. A {@link Frame} carries one
 * with its request id and, on a version-3 session, its field trailer.
 */
public sealed interface Message {
    /** The frame type byte of this message. */
    int type();

    int HELLO = 0x01, HELLO_OK = 0x02, DECIDE = 0x03, DECIDE_OK = 0x04, COMPLETE = 0x05, OUTCOME = 0x06,
            OUTCOME_IS = 0x07, PING = 0x08, PONG = 0x09, COMPLETE_HEURISTIC = 0x0a, ONE_PHASE = 0x0b, ERROR = 0x7f;

    /** Client to server: the first frame. {@code versions} empty: a version-1 client. */
    record Hello(long nodeExpected, String client, List<Integer> versions) implements Message {
        public Hello {
            versions = List.copyOf(versions);
        }

        public int type() {
            return HELLO;
        }
    }

    /** The negotiation trailer of a HelloOk (present when the Hello listed versions). */
    record Negotiated(int version, long idleTimeoutMs) {}

    record HelloOk(long node, long incarnation, long session, long frameBytesMax, long inflightMax, Negotiated negotiated)
            implements Message {
        public int type() {
            return HELLO_OK;
        }

        /** The session's protocol version: the negotiated one, 1 without the trailer. */
        public int version() {
            return negotiated == null ? 1 : negotiated.version();
        }
    }

    /** One branch of a decision: its number and the {@code [[rm]]} name of its database. */
    record Branch(int number, String rm) {}

    record Decide(DecreeXid xid, List<Branch> branches) implements Message {
        public Decide {
            branches = List.copyOf(branches);
        }

        public int type() {
            return DECIDE;
        }
    }

    record DecideOk() implements Message {
        public int type() {
            return DECIDE_OK;
        }
    }

    record Complete(DecreeXid xid) implements Message {
        public int type() {
            return COMPLETE;
        }
    }

    record CompleteHeuristic(DecreeXid xid, Heuristic heuristic) implements Message {
        public int type() {
            return COMPLETE_HEURISTIC;
        }
    }

    record OnePhase(DecreeXid xid) implements Message {
        public int type() {
            return ONE_PHASE;
        }
    }

    /** The {@code Outcome} request (type 0x06). */
    record OutcomeQuery(DecreeXid xid) implements Message {
        public int type() {
            return OUTCOME;
        }
    }

    record OutcomeIs(Outcome outcome) implements Message {
        public int type() {
            return OUTCOME_IS;
        }
    }

    record Ping() implements Message {
        public int type() {
            return PING;
        }
    }

    record Pong() implements Message {
        public int type() {
            return PONG;
        }
    }

    record Error(int code, String message) implements Message {
        public int type() {
            return ERROR;
        }
    }

    /** A version-3 trailer field: tag u16 (bit 15: must understand), value of at most 65,535 bytes. */
    record Field(int tag, byte[] value) {
        public Field {
            value = value.clone();
        }

        public boolean mustUnderstand() {
            return (tag & 0x8000) != 0;
        }

        @Override
        public byte[] value() {
            return value.clone();
        }

        @Override
        public boolean equals(Object o) {
            return o instanceof Field f && f.tag == tag && Arrays.equals(f.value, value);
        }

        @Override
        public int hashCode() {
            return tag * 31 + Arrays.hashCode(value);
        }

        @Override
        public String toString() {
            return String.format("Field[0x%04x, %d bytes]", tag, value.length);
        }
    }

    /** One decoded frame. */
    record Frame(long requestId, Message message, List<Field> trailer, int frameBytes) {
        public Frame {
            trailer = List.copyOf(trailer);
        }
    }
}
