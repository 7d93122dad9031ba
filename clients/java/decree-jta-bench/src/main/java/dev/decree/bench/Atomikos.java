package dev.decree.bench;

import com.atomikos.datasource.xa.XATransactionalResource;
import com.atomikos.icatch.config.Configuration;
import com.atomikos.icatch.jta.UserTransactionManager;
import java.nio.file.Path;
import javax.transaction.xa.XAResource;

/** Atomikos with its durable log in a directory; the no-op resources registered as one recoverable resource, as Atomikos 6 requires. */
final class Atomikos {
    private Atomikos() {}

    static final class NoopRecoverable extends XATransactionalResource {
        NoopRecoverable() {
            super("noop");
        }

        @Override
        protected XAResource refreshXAConnection() {
            return new JtaBench.NoopResource();
        }

        @Override
        public boolean usesXAResource(XAResource xares) {
            return xares instanceof JtaBench.NoopResource;
        }
    }

    static UserTransactionManager start(Path dir) throws Exception {
        System.setProperty("com.atomikos.icatch.log_base_dir", dir.toString());
        System.setProperty("com.atomikos.icatch.output_dir", dir.toString());
        System.setProperty("com.atomikos.icatch.max_actives", "-1");
        System.setProperty("com.atomikos.icatch.enable_logging", "true");
        System.setProperty("com.atomikos.icatch.threaded_2pc", "false");
        System.setProperty("com.atomikos.icatch.registered", "true");
        Configuration.addResource(new NoopRecoverable());
        UserTransactionManager utm = new UserTransactionManager();
        utm.init();
        return utm;
    }
}
