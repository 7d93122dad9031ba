package dev.decree.spring;

import dev.decree.jta.Bank;
import dev.decree.jta.DecreeServer;
import dev.decree.jta.TestEnv;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.springframework.test.context.DynamicPropertyRegistry;

/**
 * The databases of the bank application's tests, PostgreSQL pg-a as {@code bankA} and
 * MariaDB maria as {@code bankB}, and a started server over them (SpringBankTest,
 * SpringTlsTest, SpringCrashTest). Closing it stops the server.
 */
final class SpringBanks implements AutoCloseable {
    final TestEnv.Db pgA = TestEnv.pgA();
    final TestEnv.Db maria = TestEnv.maria();
    final DecreeServer server;

    /** {@code extra}: the server's further configuration lines. */
    SpringBanks(String extra) throws Exception {
        server = DecreeServer.over(extra, pgA, maria).start();
    }

    /** The application's {@code decree.datasource.*} properties for the two databases. */
    Map<String, String> datasources() {
        Map<String, String> p = new LinkedHashMap<>();
        for (var bank : List.of(Map.entry("bankA", pgA), Map.entry("bankB", maria))) {
            String prefix = "decree.datasource." + bank.getKey() + ".";
            p.put(prefix + "url", bank.getValue().jdbcUrl());
            p.put(prefix + "username", bank.getValue().properties().getProperty("user"));
            p.put(prefix + "rm", bank.getValue().rm());
        }
        return p;
    }

    /** {@link #datasources} for a {@code @DynamicPropertySource}. */
    void register(DynamicPropertyRegistry r) {
        datasources().forEach((k, v) -> r.add(k, () -> v));
    }

    /** {@link #datasources} as command-line arguments ({@code --name=value}). */
    List<String> arguments() {
        List<String> args = new ArrayList<>();
        datasources().forEach((k, v) -> args.add("--" + k + "=" + v));
        return args;
    }

    /** What is left prepared in either database after up to 10 seconds (nothing, when all is well). */
    List<String> awaitNothingPrepared() throws Exception {
        return Bank.awaitNothingPrepared(server.node, 10, pgA, maria);
    }

    @Override
    public void close() throws Exception {
        server.close();
    }
}
