package dev.decree.jta;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.Statement;
import java.util.List;
import java.util.Map;
import javax.sql.XAConnection;
import javax.transaction.xa.XAResource;
import org.junit.jupiter.api.Test;
import org.postgresql.xa.PGXADataSource;

/**
 * Why decree-jta prepares PostgreSQL branches itself (docs/protocol.md, "PostgreSQL: the
 * gid"): pgjdbc's own XAResource writes a decree Xid as {@code
 * {format_id}_{base64(gtrid)}_{base64(bqual)}} (the vector file's {@code psycopg_xid_form}),
 * and the server neither lists nor finishes that form: such a branch of a JVM that died stays
 * prepared, while the same branch under decree's gid is rolled back by presumed abort.
 */
class PgjdbcFormTest {
    @Test
    void pgjdbcWritesTheBase64FormWhichTheServerLeavesPreparedWhileDecreesGidIsFinished() throws Exception {
        TestEnv.Db pg = TestEnv.pgA();
        Bank.setUp(pg);
        PGXADataSource xads = new PGXADataSource();
        xads.setUrl(pg.jdbcUrl());
        xads.setUser(pg.properties().getProperty("user"));

        // The vector: pgjdbc's gid of the running example's branch 0 is the form the vector file lists.
        Map<String, Object> vector = null;
        for (Object o : Json.list(VectorsTest.BRANCH_IDS.get("non_canonical_gids"))) {
            if ("psycopg_xid_form".equals(Json.obj(o).get("name"))) {
                vector = Json.obj(o);
            }
        }
        DecreeXid example = DecreeXid.of(1, 7, 42, 1).branch(0);
        assertEquals(vector.get("gid"), prepareWithPgjdbc(xads, example, true));

        try (DecreeServer server = DecreeServer.over(pg).start()) {
            // Two branches of an incarnation before this node's first (its process is gone): one under
            // pgjdbc's form, one under decree's gid. Presumed abort applies to both; the server
            // can see only the second.
            DecreeXid viaPgjdbc = DecreeXid.of(server.node, 0, 1, 1).branch(0);
            DecreeXid viaDecree = DecreeXid.of(server.node, 0, 1, 2).branch(0);
            String pgjdbcGid = prepareWithPgjdbc(xads, viaPgjdbc, false);
            try {
            try (Connection c = Bank.plain(pg); Statement s = c.createStatement()) {
                c.setAutoCommit(false);
                s.execute("INSERT INTO decree_java_ledger VALUES ('decree-" + java.util.UUID.randomUUID() + "', 0)");
                s.execute("PREPARE TRANSACTION '" + viaDecree.pgGid() + "'");
                c.setAutoCommit(true);
            }
                long deadline = System.nanoTime() + 20_000_000_000L;
                while (Bank.prepared(pg, server.node).contains(viaDecree.pgGid()) && System.nanoTime() < deadline) {
                    Thread.sleep(100);
                }
                List<String> left = Bank.prepared(pg, server.node);
                assertTrue(!left.contains(viaDecree.pgGid()), "decree's gid is rolled back by the server: " + left);
                Thread.sleep(2500); // another periodic pass (periodic_pass_ms = 2000)
                assertTrue(Bank.prepared(pg, server.node).contains(pgjdbcGid), "pgjdbc's form stays prepared");
            } finally {
                for (String gid : Bank.prepared(pg, server.node)) {
                    try (Connection c = Bank.plain(pg); Statement s = c.createStatement()) {
                        s.execute("ROLLBACK PREPARED '" + gid + "'");
                    }
                }
            }
        }
        // And the library refuses pgjdbc's XAResource, saying why.
        XAConnection xc = xads.getXAConnection();
        try {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> DecreeResource.named(xc.getXAResource(), "pg-a"));
            assertTrue(e.getMessage().contains("neither lists nor finishes"), e.getMessage());
        } finally {
            xc.close();
        }
    }

    /** Prepares a branch {@code xid} through pgjdbc's XAResource; its gid in pg_prepared_xacts (rolled back again if asked). */
    static String prepareWithPgjdbc(PGXADataSource xads, DecreeXid xid, boolean rollBack) throws Exception {
        XAConnection xc = xads.getXAConnection();
        try {
            XAResource r = xc.getXAResource();
            r.start(xid, XAResource.TMNOFLAGS);
            try (Statement s = xc.getConnection().createStatement()) {
                s.execute("INSERT INTO decree_java_ledger VALUES ('pgjdbc-" + java.util.UUID.randomUUID() + "', 0)");
            }
            r.end(xid, XAResource.TMSUCCESS);
            r.prepare(xid);
            String gid = null;
            try (Connection c = xads.getConnection(); Statement s = c.createStatement();
                    ResultSet rs = s.executeQuery("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE '1684238949\\_%'")) {
                while (rs.next()) {
                    if (gid == null || rs.getString(1).contains(java.util.Base64.getEncoder().encodeToString(xid.getGlobalTransactionId()))) {
                        gid = rs.getString(1);
                    }
                }
            }
            if (rollBack) {
                r.rollback(xid);
            }
            return gid;
        } finally {
            xc.close();
        }
    }
}
