package dev.decree.jta;

import java.nio.file.Files;
import java.nio.file.Path;

/** Where the repository, the decree binary and the test databases are. */
final class TestEnv {
    private TestEnv() {}

    static final boolean CI = "true".equals(System.getenv("CI")) || "1".equals(System.getenv("CI"));

    static Path repo() {
        String env = System.getenv("DECREE_REPO");
        Path p = env != null ? Path.of(env) : Path.of("").toAbsolutePath();
        p = p.toAbsolutePath().normalize();
        while (p != null && !Files.isDirectory(p.resolve("docs/vectors"))) {
            p = p.getParent();
        }
        if (p == null) {
            throw new IllegalStateException("cannot find the repository (docs/vectors) above " + Path.of("").toAbsolutePath());
        }
        return p;
    }
}
