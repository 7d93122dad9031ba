package dev.decree.jta;

/** The answers to {@code Outcome} (docs/protocol.md, session rule 6). */
public enum Outcome {
    COMMITTED(1), IN_PROGRESS(2), ROLLED_BACK(3), UNKNOWN(4), HEURISTIC(5);

    final int code;

    Outcome(int code) {
        this.code = code;
    }

    static Outcome of(int code) {
        for (Outcome o : values()) {
            if (o.code == code) {
                return o;
            }
        }
        return null;
    }

    @Override
    public String toString() {
        return name().toLowerCase().replace('_', ' ');
    }
}
