package dev.decree.jta;

import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.HexFormat;
import javax.transaction.xa.Xid;

/**
 * An XA transaction id as decree names it (docs/protocol.md, "Xid" and "Branches in the
 * databases"): format id {@code 0x64637265}, a 28-byte gtrid {@code node u32 | incarnation
 * u64 | session u64 | sequence u64}, and a bqual that is empty for the global transaction and
 * the branch number (2 bytes, big-endian) for a branch. On MariaDB and MySQL a branch's name
 * on the server also carries the preparing connection's {@code CONNECTION_ID()}, 8 bytes,
 * after the branch number ({@link #mariadbName(long)}).
 *
 * <p>Immutable; equal when format id, gtrid and bqual are equal. This is the {@link Xid} the
 * library hands to every {@code XAResource} it enlists.
 */
public final class DecreeXid implements Xid {
    /** decree's format id, "dcre". */
    public static final int FORMAT_ID = 0x64637265;
    /** The prefix of every PostgreSQL gid decree writes. */
    public static final String GID_PREFIX = "decree:";
    static final int GTRID_BYTES = 28;
    static final int PART_BYTES_MAX = 64;
    private static final HexFormat HEX = HexFormat.of();

    private final int formatId;
    private final byte[] gtrid;
    private final byte[] bqual;

    public DecreeXid(int formatId, byte[] gtrid, byte[] bqual) {
        if (gtrid.length > PART_BYTES_MAX || bqual.length > PART_BYTES_MAX) {
            throw new IllegalArgumentException("gtrid and bqual are at most 64 bytes each");
        }
        this.formatId = formatId;
        this.gtrid = gtrid.clone();
        this.bqual = bqual.clone();
    }

    /** The global Xid of transaction {@code sequence} of a session (empty bqual). */
    public static DecreeXid of(long node, long incarnation, long session, long sequence) {
        ByteBuffer b = ByteBuffer.allocate(GTRID_BYTES);
        b.putInt((int) node).putLong(incarnation).putLong(session).putLong(sequence);
        return new DecreeXid(FORMAT_ID, b.array(), new byte[0]);
    }

    /** An Xid of any transaction manager (as a JDBC driver or XA RECOVER gives it). */
    public static DecreeXid copyOf(Xid xid) {
        if (xid instanceof DecreeXid d) {
            return d;
        }
        return new DecreeXid(xid.getFormatId(), xid.getGlobalTransactionId(), xid.getBranchQualifier());
    }

    @Override
    public int getFormatId() {
        return formatId;
    }

    @Override
    public byte[] getGlobalTransactionId() {
        return gtrid.clone();
    }

    @Override
    public byte[] getBranchQualifier() {
        return bqual.clone();
    }

    /** Branch {@code number} of this global transaction (bqual: the number, 2 bytes). */
    public DecreeXid branch(int number) {
        if (number < 0 || number > 0xffff) {
            throw new IllegalArgumentException("a branch number is a u16, not " + number);
        }
        return new DecreeXid(formatId, gtrid, new byte[] {(byte) (number >> 8), (byte) number});
    }

    /** The global transaction of this Xid (the same format id and gtrid, empty bqual). */
    public DecreeXid global() {
        return bqual.length == 0 ? this : new DecreeXid(formatId, gtrid, new byte[0]);
    }

    /** Whether format id and gtrid are decree's (28 bytes, format id "dcre"). */
    public boolean isDecree() {
        return formatId == FORMAT_ID && gtrid.length == GTRID_BYTES;
    }

    public long node() {
        requireDecree();
        return ByteBuffer.wrap(gtrid).getInt(0) & 0xffffffffL;
    }

    public long incarnation() {
        requireDecree();
        return ByteBuffer.wrap(gtrid).getLong(4);
    }

    public long session() {
        requireDecree();
        return ByteBuffer.wrap(gtrid).getLong(12);
    }

    public long sequence() {
        requireDecree();
        return ByteBuffer.wrap(gtrid).getLong(20);
    }

    /** The branch number of a branch Xid (a 2-byte, or a MariaDB name's 10-byte, bqual), or -1. */
    public int branchNumber() {
        if (bqual.length != 2 && bqual.length != 10) {
            return -1;
        }
        return ((bqual[0] & 0xff) << 8) | (bqual[1] & 0xff);
    }

    private void requireDecree() {
        if (!isDecree()) {
            throw new IllegalStateException(this + " is not a decree Xid");
        }
    }

    /** The wire form: format id i32, gtrid length u8, bqual length u8, gtrid, bqual. */
    public byte[] encode() {
        ByteBuffer b = ByteBuffer.allocate(6 + gtrid.length + bqual.length);
        encodeInto(b);
        return b.array();
    }

    void encodeInto(ByteBuffer b) {
        b.putInt(formatId).put((byte) gtrid.length).put((byte) bqual.length).put(gtrid).put(bqual);
    }

    int encodedLength() {
        return 6 + gtrid.length + bqual.length;
    }

    /** Reads an Xid at the buffer's position; {@link FrameException} (Malformed) when it does not fit. */
    static DecreeXid decode(ByteBuffer b, String what) throws FrameException {
        if (b.remaining() < 6) {
            throw FrameException.malformed(what + ": Xid header truncated");
        }
        int format = b.getInt();
        int g = b.get() & 0xff;
        int q = b.get() & 0xff;
        if (g > PART_BYTES_MAX || q > PART_BYTES_MAX) {
            throw FrameException.malformed(what + ": Xid part longer than 64 bytes");
        }
        if (b.remaining() < g + q) {
            throw FrameException.malformed(what + ": Xid truncated");
        }
        byte[] gt = new byte[g];
        byte[] bq = new byte[q];
        b.get(gt).get(bq);
        return new DecreeXid(format, gt, bq);
    }

    /**
     * The PostgreSQL gid of this Xid: {@code decree:<format id, 8 hex>:<gtrid hex>:<bqual hex>},
     * lowercase, exactly as the server rebuilds it to finish the branch.
     */
    public String pgGid() {
        return GID_PREFIX + String.format("%08x", formatId) + ":" + HEX.formatHex(gtrid) + ":" + HEX.formatHex(bqual);
    }

    /** The Xid of a gid in decree's form; IllegalArgumentException for anything else. */
    public static DecreeXid fromPgGid(String gid) {
        if (!gid.startsWith(GID_PREFIX)) {
            throw new IllegalArgumentException("not a decree gid: " + gid);
        }
        String[] parts = gid.substring(GID_PREFIX.length()).split(":", -1);
        if (parts.length != 3 || parts[0].length() != 8) {
            throw new IllegalArgumentException("not a decree gid: " + gid);
        }
        for (String p : parts) {
            if (!p.equals(p.toLowerCase()) || p.length() % 2 != 0) {
                throw new IllegalArgumentException("not a canonical decree gid: " + gid);
            }
        }
        return new DecreeXid(Integer.parseUnsignedInt(parts[0], 16), HEX.parseHex(parts[1]), HEX.parseHex(parts[2]));
    }

    /** The xid as MariaDB's XA statements take it: {@code X'<gtrid>',X'<bqual>',<format id>}. */
    public String mysqlXid() {
        return "X'" + HEX.formatHex(gtrid) + "',X'" + HEX.formatHex(bqual) + "'," + Integer.toUnsignedString(formatId);
    }

    /** This branch's name on a MariaDB server when the connection {@code connectionId} prepares it. */
    public DecreeXid mariadbName(long connectionId) {
        if (bqual.length != 2) {
            throw new IllegalStateException(this + " is not a branch Xid");
        }
        return new DecreeXid(formatId, gtrid, ByteBuffer.allocate(10).put(bqual).putLong(connectionId).array());
    }

    /** The branch Xid a MariaDB name stands for (a 10-byte bqual loses the connection id). */
    public DecreeXid branchOfMariadbName() {
        return bqual.length == 10 ? new DecreeXid(formatId, gtrid, Arrays.copyOf(bqual, 2)) : this;
    }

    /** The connection id in a MariaDB name's bqual, or -1 for a 2-byte bqual. */
    public long mariadbConnectionId() {
        return bqual.length == 10 ? ByteBuffer.wrap(bqual).getLong(2) : -1;
    }

    /** The Xid of an {@code XA RECOVER} row. */
    public static DecreeXid fromXaRecover(int formatId, int gtridLength, int bqualLength, byte[] data) {
        if (data.length != gtridLength + bqualLength) {
            throw new IllegalArgumentException("XA RECOVER data is " + data.length + " bytes, not " + (gtridLength + bqualLength));
        }
        return new DecreeXid(formatId, Arrays.copyOf(data, gtridLength), Arrays.copyOfRange(data, gtridLength, data.length));
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof DecreeXid x && x.formatId == formatId && Arrays.equals(x.gtrid, gtrid) && Arrays.equals(x.bqual, bqual);
    }

    @Override
    public int hashCode() {
        return 31 * (31 * formatId + Arrays.hashCode(gtrid)) + Arrays.hashCode(bqual);
    }

    /** {@code node.incarnation.session.sequence[/branch]} for decree's Xids, the gid otherwise. */
    @Override
    public String toString() {
        if (!isDecree()) {
            return pgGid();
        }
        String s = Long.toUnsignedString(node()) + "." + Long.toUnsignedString(incarnation()) + "."
                + Long.toUnsignedString(session()) + "." + Long.toUnsignedString(sequence());
        if (bqual.length == 0) {
            return s;
        }
        if (bqual.length == 2) {
            return s + "/" + branchNumber();
        }
        return s + "/" + HEX.formatHex(bqual);
    }
}
