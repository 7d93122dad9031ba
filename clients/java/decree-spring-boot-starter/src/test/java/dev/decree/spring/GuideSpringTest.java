package dev.decree.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.decree.jta.GuideBanks;
import dev.decree.jta.TestEnv;
import java.nio.file.Files;
import java.nio.file.Path;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * docs/guide.md's Spring Boot application, compiled and run as written with its
 * application.properties, the addresses overridden on the command line, against a real
 * server and the two PostgreSQL test databases (a schema of its own in each).
 */
class GuideSpringTest {
    @Test
    void theGuidesSpringApplicationMovesMoney(@TempDir Path tmp) throws Exception {
        try (GuideBanks banks = new GuideBanks("guide_spring_",
                "CREATE TABLE %s.accounts (id int PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0))",
                "INSERT INTO %s.accounts VALUES (1, 100)")) {
            Path src = tmp.resolve("src/bank/BankApplication.java");
            Files.createDirectories(src.getParent());
            Files.writeString(src, GuideBanks.block("<!-- guide-program-spring:", "java"));
            Path classes = tmp.resolve("classes");
            Files.createDirectories(classes);
            Files.writeString(classes.resolve("application.properties"), GuideBanks.block("<!-- guide-properties-spring:", "properties"));
            JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
            int rc = javac.run(null, null, null, "-d", classes.toString(), "-cp", System.getProperty("java.class.path"), "-parameters",
                    src.toString());
            assertEquals(0, rc, "the guide's application compiles");
            ProcessBuilder pb = TestEnv.java(classes + java.io.File.pathSeparator, "bank.BankApplication",
                    "--decree.endpoint=" + banks.server.endpoint(),
                    "--decree.datasource.bankA.url=" + banks.url(banks.pgA),
                    "--decree.datasource.bankA.username=" + banks.pgA.properties().getProperty("user"),
                    "--decree.datasource.bankB.url=" + banks.url(banks.pgB),
                    "--decree.datasource.bankB.username=" + banks.pgB.properties().getProperty("user"),
                    "--logging.level.root=WARN", "--spring.main.banner-mode=off");
            String[] outErr = GuideBanks.run(pb, tmp);
            assertTrue(outErr[0].contains("A 70 B 130"), outErr[0] + outErr[1]);
            banks.assertOneDecisionAndNothingPrepared("the first transfer: one decision");
        }
    }
}
