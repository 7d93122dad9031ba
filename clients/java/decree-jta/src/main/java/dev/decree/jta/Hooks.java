package dev.decree.jta;

import java.util.function.BiConsumer;

/**
 * Test points of the commit: the crash tests stop a child JVM at one of them and kill it
 * (SIGKILL). No-ops unless a test installs {@link #hook}. Steps: {@code prepared} (every
 * branch prepared, no decision sent), {@code decide-sent} (the Decide written, its answer
 * not read), {@code decided} (DecideOk read, phase two not begun), {@code phase-two} (the
 * first branch committed, the others not).
 */
final class Hooks {
    private Hooks() {}

    static volatile BiConsumer<String, DecreeXid> hook;

    static void step(String name, DecreeXid xid) {
        BiConsumer<String, DecreeXid> h = hook;
        if (h != null) {
            h.accept(name, xid);
        }
    }
}
