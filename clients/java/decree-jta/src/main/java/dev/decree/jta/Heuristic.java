package dev.decree.jta;

/** A heuristic outcome as {@code CompleteHeuristic} reports it. */
public enum Heuristic {
    COMMITTED(1), ROLLED_BACK(2), MIXED(3);

    final int code;

    Heuristic(int code) {
        this.code = code;
    }

    static Heuristic of(int code) {
        for (Heuristic h : values()) {
            if (h.code == code) {
                return h;
            }
        }
        return null;
    }

    /** The combined outcome of two branches' heuristics ({@code other} may be null). */
    public Heuristic combine(Heuristic other) {
        return other == null || other == this ? this : MIXED;
    }
}
