package dev.decree.jta;

import javax.transaction.xa.XAResource;

/**
 * An {@link XAResource} the decree server can finish: its branches live in the database of the
 * server's {@code [[rm]]} entry {@link #rmName()} and are named as docs/protocol.md, "Branches
 * in the databases", says. The transaction manager refuses to enlist any other resource,
 * since the server could never finish its branch after this JVM died.
 *
 * <p>The resources of {@link DecreeDataSource} implement it; {@link #named} wraps another
 * {@code XAResource} that writes decree's Xids unchanged into its resource manager.
 */
public interface DecreeResource extends XAResource {
    /** The name of the server's {@code [[rm]]} entry whose database holds this resource's branches. */
    String rmName();

    /**
     * Lets go of anything that would keep the server from finishing a prepared branch (a
     * MariaDB branch stays attached to the connection that prepared it: close it). Called
     * before a branch is left to the server. Nothing by default.
     */
    default void abandon() {}

    /** Whether this resource holds a prepared branch no other connection can finish (see {@link #abandon}). */
    default boolean holdsPrepared() {
        return false;
    }

    /**
     * {@code resource} under the server's {@code [[rm]]} name {@code rm}. The resource must
     * store the Xids it is given as they are, in a form the server's recovery lists and
     * finishes: a PostgreSQL resource must write decree's gid ({@code decree:...}), which
     * pgjdbc's {@code PGXAConnection} does not (it is refused here: use
     * {@link DecreeDataSource}); for a resource of the server's {@code dummy} kind any
     * resource that votes will do.
     */
    static DecreeResource named(XAResource resource, String rm) {
        if (resource.getClass().getName().startsWith("org.postgresql.")) {
            throw new IllegalArgumentException("pgjdbc's XAResource names its branches {format id}_{base64 gtrid}_{base64 bqual}, "
                    + "which the decree server neither lists nor finishes: a branch of a JVM that died would stay prepared. "
                    + "Use dev.decree.jta.DecreeDataSource, which prepares PostgreSQL branches under decree's own gid");
        }
        return new NamedResource(resource, rm);
    }
}
