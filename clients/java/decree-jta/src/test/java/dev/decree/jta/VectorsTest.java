package dev.decree.jta;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.decree.jta.Message.Branch;
import dev.decree.jta.Message.Field;
import dev.decree.jta.Message.Frame;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/**
 * The codec against docs/vectors: every message vector encodes to exactly its bytes and
 * decodes to exactly its fields (for the vector's own version and every later one), every
 * invalid one is refused with its named error, and every branch id is what the library
 * writes for PostgreSQL and MariaDB.
 */
class VectorsTest {
    static final HexFormat HEX = HexFormat.of();
    static final Map<String, Object> MESSAGES = load("messages.json");
    static final Map<String, Object> BRANCH_IDS = load("branch_ids.json");

    static Map<String, Object> load(String name) {
        try {
            return Json.obj(Json.parse(Files.readString(TestEnv.repo().resolve("docs/vectors").resolve(name))));
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
    }

    static DecreeXid xid(Object o) {
        Map<String, Object> v = Json.obj(o);
        return new DecreeXid((int) Json.num(v.get("format_id")), HEX.parseHex((String) v.get("gtrid")),
                HEX.parseHex((String) v.get("bqual")));
    }

    static Message message(String type, Map<String, Object> f) {
        return switch (type) {
            case "Hello" -> new Message.Hello(Json.num(f.get("node_expected")), (String) f.get("client"),
                    f.containsKey("versions") ? Json.list(f.get("versions")).stream().map(v -> (int) Json.num(v)).toList() : List.of());
            case "HelloOk" -> {
                Map<String, Object> n = f.containsKey("negotiated") ? Json.obj(f.get("negotiated")) : null;
                yield new Message.HelloOk(Json.num(f.get("node")), Json.num(f.get("incarnation")), Json.num(f.get("session")),
                        Json.num(f.get("frame_bytes_max")), Json.num(f.get("inflight_max")),
                        n == null ? null : new Message.Negotiated((int) Json.num(n.get("version")), Json.num(n.get("idle_timeout_ms"))));
            }
            case "Decide" -> new Message.Decide(xid(f.get("xid")), Json.list(f.get("branches")).stream()
                    .map(b -> new Branch((int) Json.num(Json.obj(b).get("branch")), (String) Json.obj(b).get("rm"))).toList());
            case "DecideOk" -> new Message.DecideOk();
            case "Complete" -> new Message.Complete(xid(f.get("xid")));
            case "CompleteHeuristic" -> new Message.CompleteHeuristic(xid(f.get("xid")),
                    Heuristic.valueOf(((String) f.get("heuristic")).toUpperCase()));
            case "Outcome" -> new Message.OutcomeQuery(xid(f.get("xid")));
            case "OnePhase" -> new Message.OnePhase(xid(f.get("xid")));
            case "OutcomeIs" -> new Message.OutcomeIs(Outcome.valueOf(((String) f.get("outcome")).toUpperCase()));
            case "Ping" -> new Message.Ping();
            case "Pong" -> new Message.Pong();
            case "Error" -> new Message.Error((int) Json.num(f.get("code")), (String) f.get("message"));
            default -> throw new AssertionError("unknown message type " + type + " in the vectors");
        };
    }

    static List<Field> trailer(Map<String, Object> f) {
        if (!f.containsKey("trailer")) {
            return List.of();
        }
        return Json.list(f.get("trailer")).stream()
                .map(t -> new Field((int) Json.num(Json.obj(t).get("tag")), HEX.parseHex((String) Json.obj(t).get("value")))).toList();
    }

    static Frame decode(String hex, int version) throws FrameException {
        Protocol.Decoder d = new Protocol.Decoder(Protocol.FRAME_BYTES_MAX, version);
        d.feed(HEX.parseHex(hex));
        Frame f = d.next();
        assertNotNull(f);
        assertEquals(0, d.buffered());
        return f;
    }

    @Test
    void theVectorFileDescribesThisProtocol() {
        assertEquals(1L, Json.num(MESSAGES.get("frame_version")));
        assertEquals(Protocol.PROTOCOL_VERSIONS, Json.list(MESSAGES.get("protocol_versions")).stream().map(v -> (int) Json.num(v)).toList());
        assertEquals((long) Protocol.FRAME_BYTES_MAX, Json.num(MESSAGES.get("frame_bytes_max")));
        assertEquals("big-endian", MESSAGES.get("byte_order"));
        Set<String> types = new java.util.TreeSet<>();
        for (Object v : Json.list(MESSAGES.get("messages"))) {
            types.add((String) Json.obj(v).get("type"));
        }
        assertEquals(new java.util.TreeSet<>(List.of("Hello", "HelloOk", "Decide", "DecideOk", "Complete", "CompleteHeuristic",
                "Outcome", "OnePhase", "OutcomeIs", "Ping", "Pong", "Error")), types, "every message type has a vector");
    }

    @TestFactory
    Stream<DynamicTest> everyVectorEncodesAndDecodesExactly() {
        return Json.list(MESSAGES.get("messages")).stream().map(Json::obj).map(v -> DynamicTest.dynamicTest((String) v.get("name"), () -> {
            Map<String, Object> f = Json.obj(v.get("fields"));
            Message m = message((String) v.get("type"), f);
            List<Field> fields = trailer(f);
            long request = Json.num(v.get("request_id"));
            String hex = (String) v.get("hex");
            assertEquals(hex, HEX.formatHex(Protocol.encodeFrame(request, m, fields)));
            int since = v.containsKey("since") ? (int) Json.num(v.get("since")) : 1;
            for (int version = since; version <= 3; version++) {
                Frame frame = decode(hex, version);
                assertEquals(request, frame.requestId(), "version " + version);
                assertEquals(m, frame.message(), "version " + version);
                assertEquals(fields, frame.trailer(), "version " + version);
                assertEquals(hex.length() / 2, frame.frameBytes());
            }
            if (!fields.isEmpty()) {
                for (int version = 1; version < 3; version++) {
                    int old = version;
                    FrameException e = assertThrows(FrameException.class, () -> decode(hex, old));
                    assertEquals("Malformed", e.kind());
                    assertTrue(e.getMessage().contains("trailing bytes"), e.getMessage());
                }
            }
        }));
    }

    @Test
    void allVectorsBackToBackSplitAtEveryByteDecodeInOrder() throws FrameException {
        java.io.ByteArrayOutputStream stream = new java.io.ByteArrayOutputStream();
        List<Message> expected = new ArrayList<>();
        for (Object o : Json.list(MESSAGES.get("messages"))) {
            Map<String, Object> v = Json.obj(o);
            stream.writeBytes(HEX.parseHex((String) v.get("hex")));
            expected.add(message((String) v.get("type"), Json.obj(v.get("fields"))));
        }
        byte[] all = stream.toByteArray();
        for (int step : new int[] {1, 3, 7, 64, all.length}) {
            Protocol.Decoder d = new Protocol.Decoder(Protocol.FRAME_BYTES_MAX, 3);
            List<Message> got = new ArrayList<>();
            for (int at = 0; at < all.length; at += step) {
                d.feed(all, at, Math.min(step, all.length - at));
                Frame f;
                while ((f = d.next()) != null) {
                    got.add(f.message());
                }
            }
            assertEquals(expected, got, "fed " + step + " bytes at a time");
        }
    }

    @TestFactory
    Stream<DynamicTest> everyInvalidVectorIsRefusedWithItsNamedError() {
        return Json.list(MESSAGES.get("invalid")).stream().map(Json::obj).flatMap(v -> Stream.of(1, 2, 3).map(version ->
                DynamicTest.dynamicTest(v.get("name") + " v" + version, () -> {
                    Protocol.Decoder d = new Protocol.Decoder(Protocol.FRAME_BYTES_MAX, version);
                    d.feed(HEX.parseHex((String) v.get("hex")));
                    FrameException e = assertThrows(FrameException.class, d::next);
                    assertEquals(v.get("error"), e.kind());
                })));
    }

    @Test
    void theTrailerVectorsAreRefusedForTheirOwnReasonOnAVersion3Session() {
        Map<String, String> reasons = new java.util.HashMap<>(Map.of("decide_trailer_overrun", "overruns the frame",
                "decide_trailer_duplicate_tag", "given twice"));
        for (Object o : Json.list(MESSAGES.get("invalid"))) {
            Map<String, Object> v = Json.obj(o);
            String reason = reasons.remove((String) v.get("name"));
            if (reason != null) {
                FrameException e = assertThrows(FrameException.class, () -> decode((String) v.get("hex"), 3));
                assertTrue(e.getMessage().contains(reason), e.getMessage());
            }
        }
        assertTrue(reasons.isEmpty(), "both trailer vectors are in the file");
    }

    @Test
    void helloAndErrorNeverCarryATrailerAndHelloOkOnlyAfterChoosingVersion3() throws FrameException {
        List<Field> field = List.of(new Field(0x0101, "abc".getBytes()));
        assertThrows(IllegalArgumentException.class, () -> Protocol.encodeFrame(1, new Message.Hello(0, "c", List.of(1, 2, 3)), field));
        assertThrows(IllegalArgumentException.class, () -> Protocol.encodeFrame(1, new Message.Error(1, "x"), field));
        Message.HelloOk old = new Message.HelloOk(1, 7, 42, 65536, 64, new Message.Negotiated(2, 0));
        assertThrows(IllegalArgumentException.class, () -> Protocol.encodeFrame(1, old, field));
        Message.HelloOk fresh = new Message.HelloOk(1, 7, 42, 65536, 64, new Message.Negotiated(3, 0));
        Frame got = decode(HEX.formatHex(Protocol.encodeFrame(1, fresh, field)), 1); // the HelloOk says its own version.
        assertEquals(fresh, got.message());
        assertEquals(field, got.trailer());
        List<Field> twice = List.of(field.get(0), field.get(0));
        assertThrows(IllegalArgumentException.class, () -> Protocol.encodeFrame(2, new Message.Ping(), twice));
    }

    @Test
    void everyErrorVectorNamesItsCodeAsTheVectorDoes() {
        int seen = 0;
        for (Object o : Json.list(MESSAGES.get("messages"))) {
            Map<String, Object> v = Json.obj(o);
            if (!"Error".equals(v.get("type"))) {
                continue;
            }
            int code = (int) Json.num(Json.obj(v.get("fields")).get("code"));
            // error_not_kept is NotKept, error_must_understand MustUnderstand, ...
            String expected = ((String) v.get("name")).substring("error_".length()).replace("_", "");
            assertEquals(expected, ErrorCodes.name(code).toLowerCase(), (String) v.get("name"));
            seen++;
        }
        assertTrue(seen >= 6, "the Error vectors are in the file");
        assertEquals(21, ErrorCodes.NOT_KEPT);
        assertTrue(ErrorCodes.keepsConnection(ErrorCodes.NOT_KEPT), "NotKept leaves the connection open");
    }

    @Test
    void theKeptVectorCarriesTheMustUnderstandKeptReplyFieldWithAnEmptyValue() throws FrameException {
        for (Object o : Json.list(MESSAGES.get("messages"))) {
            Map<String, Object> v = Json.obj(o);
            if ("complete_heuristic_v3_kept".equals(v.get("name"))) {
                Frame f = decode((String) v.get("hex"), 3);
                Field kept = new Field(Protocol.REPLY_WHEN_KEPT, new byte[0]);
                assertEquals(List.of(kept), f.trailer());
                assertTrue(kept.mustUnderstand());
                assertEquals(v.get("hex"), HEX.formatHex(Protocol.encodeFrame(3, f.message(), List.of(kept))));
                return;
            }
        }
        throw new AssertionError("complete_heuristic_v3_kept is not in docs/vectors/messages.json");
    }

    @Test
    void aReceiverSkipsUnknownOptionalFieldsOnly() {
        Field optional = new Field(0x0101, "abc".getBytes());
        Field must = new Field(0x8101, new byte[0]);
        assertNull(Protocol.unknownMustUnderstand(List.of(optional), Set.of()));
        assertEquals(must, Protocol.unknownMustUnderstand(List.of(optional, must), Set.of()));
        assertNull(Protocol.unknownMustUnderstand(List.of(must), Set.of(0x8101)));
    }

    @Test
    void aFrameIsJudgedByItsHeaderBeforeItsBodyArrives() {
        Protocol.Decoder d = new Protocol.Decoder(Protocol.FRAME_BYTES_MAX, 1);
        d.feed(HEX.parseHex("0000ffff"));
        assertEquals("TooLarge", assertThrows(FrameException.class, d::next).kind());
        Protocol.Decoder d2 = new Protocol.Decoder(Protocol.FRAME_BYTES_MAX, 1);
        d2.feed(HEX.parseHex("0000001001ee"));
        assertEquals("UnknownType", assertThrows(FrameException.class, d2::next).kind());
    }

    @Test
    void aDecisionPastItsLimitsIsRefusedBeforeEncoding() {
        DecreeXid x = DecreeXid.of(1, 7, 42, 1);
        assertThrows(IllegalArgumentException.class, () -> Protocol.checkDecision(x, List.of()));
        assertThrows(IllegalArgumentException.class, () -> Protocol.checkDecision(x, List.of(new Branch(0, "a"), new Branch(0, "b"))));
        assertThrows(IllegalArgumentException.class, () -> Protocol.checkDecision(x, List.of(new Branch(0, "x".repeat(65)))));
        assertThrows(IllegalArgumentException.class, () -> Protocol.checkDecision(x.branch(0), List.of(new Branch(0, "a"))));
        List<Branch> max = new ArrayList<>();
        for (int i = 0; i < 512; i++) {
            max.add(new Branch(i, "r".repeat(64)));
        }
        Protocol.checkDecision(x, max);
        max.add(new Branch(512, "r"));
        assertThrows(IllegalArgumentException.class, () -> Protocol.checkDecision(x, max));
    }

    @TestFactory
    Stream<DynamicTest> everyBranchIdIsWhatTheLibraryWrites() {
        return Json.list(BRANCH_IDS.get("branches")).stream().map(Json::obj).map(v -> DynamicTest.dynamicTest((String) v.get("name"), () -> {
            Map<String, Object> o = Json.obj(v.get("origin"));
            DecreeXid branch = DecreeXid.of(Json.num(o.get("node")), Json.num(o.get("incarnation")), Json.num(o.get("session")),
                    Json.num(o.get("sequence"))).branch((int) Json.num(v.get("branch")));
            assertEquals(DecreeXid.FORMAT_ID, branch.getFormatId());
            assertEquals(Json.num(BRANCH_IDS.get("format_id")), Json.num(v.get("format_id")));
            assertEquals((long) DecreeXid.FORMAT_ID, Json.num(v.get("format_id")));
            assertEquals(BRANCH_IDS.get("gid_prefix"), DecreeXid.GID_PREFIX);
            assertEquals(v.get("gtrid"), HEX.formatHex(branch.getGlobalTransactionId()));
            assertEquals(v.get("bqual"), HEX.formatHex(branch.getBranchQualifier()));
            assertEquals(v.get("xid_binary"), HEX.formatHex(branch.encode()));
            assertEquals(v.get("postgres_gid"), branch.pgGid());
            assertEquals(branch, DecreeXid.fromPgGid((String) v.get("postgres_gid")));
            assertEquals(v.get("mysql_xid"), branch.mysqlXid());
            Map<String, Object> row = Json.obj(v.get("mysql_xa_recover"));
            assertEquals(branch, DecreeXid.fromXaRecover((int) Json.num(row.get("formatID")), (int) Json.num(row.get("gtrid_length")),
                    (int) Json.num(row.get("bqual_length")), HEX.parseHex((String) row.get("data"))));
            Map<String, Object> named = Json.obj(v.get("mariadb_name"));
            long id = Json.num(named.get("connection_id"));
            DecreeXid name = branch.mariadbName(id);
            assertEquals(named.get("bqual"), HEX.formatHex(name.getBranchQualifier()));
            assertEquals(named.get("mysql_xid"), name.mysqlXid());
            Map<String, Object> row2 = Json.obj(named.get("mysql_xa_recover"));
            DecreeXid listed = DecreeXid.fromXaRecover((int) Json.num(row2.get("formatID")), (int) Json.num(row2.get("gtrid_length")),
                    (int) Json.num(row2.get("bqual_length")), HEX.parseHex((String) row2.get("data")));
            assertEquals(name, listed);
            assertEquals(branch, listed.branchOfMariadbName());
            assertEquals(id, listed.mariadbConnectionId());
            assertEquals(-1, branch.mariadbConnectionId());
            assertEquals(Json.num(o.get("node")), branch.node());
            assertEquals(Json.num(o.get("incarnation")), branch.incarnation());
            assertEquals(Json.num(o.get("session")), branch.session());
            assertEquals(Json.num(o.get("sequence")), branch.sequence());
            assertEquals(Json.num(v.get("branch")), branch.branchNumber());
            String gid = (String) v.get("postgres_gid");
            assertEquals(gid.substring(0, gid.lastIndexOf(':') + 1), branch.global().pgGid());
        }));
    }

    @Test
    void theGlobalXidIsWhatDecideCompleteAndOutcomeCarry() {
        Map<String, Object> v = Json.obj(BRANCH_IDS.get("global"));
        Map<String, Object> o = Json.obj(v.get("origin"));
        DecreeXid global = DecreeXid.of(Json.num(o.get("node")), Json.num(o.get("incarnation")), Json.num(o.get("session")),
                Json.num(o.get("sequence")));
        assertEquals(v.get("gtrid"), HEX.formatHex(global.getGlobalTransactionId()));
        assertEquals(v.get("bqual"), HEX.formatHex(global.getBranchQualifier()));
        assertEquals(v.get("xid_binary"), HEX.formatHex(global.encode()));
        assertEquals(v.get("postgres_gid"), global.pgGid());
        assertEquals(global, global.branch(3).global());
    }

    @Test
    void nonCanonicalGidsAreNotDecrees() {
        for (Object o : Json.list(BRANCH_IDS.get("non_canonical_gids"))) {
            String gid = (String) Json.obj(o).get("gid");
            try {
                DecreeXid x = DecreeXid.fromPgGid(gid);
                assertTrue(!x.pgGid().equals(gid) || x.branchNumber() < 0, gid + " read as a branch the library writes");
            } catch (IllegalArgumentException expected) {
                // refused: fine.
            }
        }
        assertArrayEquals(new byte[] {0, 1}, DecreeXid.of(1, 1, 1, 1).branch(1).getBranchQualifier());
    }
}
