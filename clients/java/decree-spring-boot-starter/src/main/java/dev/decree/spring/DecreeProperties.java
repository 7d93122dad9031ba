package dev.decree.spring;

import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;
import org.springframework.boot.context.properties.ConfigurationProperties;

/**
 * {@code decree.*}: where the decree server is, and the application's databases.
 *
 * <pre>
 * decree.endpoint=unix:/run/decree/decree.sock        # or tcp:host:port, tls:host:port; a comma-separated pair
 * decree.datasource.bank-a.url=jdbc:postgresql://db1/bank_a
 * decree.datasource.bank-a.username=app
 * decree.datasource.bank-a.rm=bank-a                   # the server's [[rm]] name (default: the key)
 * decree.datasource.bank-b.url=jdbc:mariadb://db2/bank_b
 * </pre>
 */
@ConfigurationProperties("decree")
public class DecreeProperties {
    /** The decree server: {@code unix:/path}, {@code tcp:host:port} or {@code tls:host:port}; a comma-separated list names a pair. */
    private String endpoint;
    /** The name the server logs for this application's sessions. */
    private String clientName = "decree-spring";
    /** The node id the server must have (0: any). */
    private long nodeExpected;
    /** How long an answer from the server is waited for before a Decide counts as lost (then resolved with Outcome). */
    private Duration replyTimeout = Duration.ofSeconds(30);
    /** How long a lost answer is asked about with Outcome before the outcome is reported unknown. */
    private Duration outcomeTimeout = Duration.ofSeconds(30);
    /** The timeout of transactions that set none (0: none). */
    private Duration defaultTimeout = Duration.ofSeconds(60);
    /** TLS for a {@code tls:} endpoint: PEM files. */
    private final Tls tls = new Tls();
    /** The databases, by bean name: each becomes a pooled, XA-enlisting {@code DataSource}. */
    private final Map<String, DataSourceSpec> datasource = new LinkedHashMap<>();

    public static class Tls {
        /** The CA that signed the server's certificate (PEM). */
        private String ca;
        /** This application's certificate chain (PEM). */
        private String cert;
        /** Its private key (PKCS#8 PEM). */
        private String key;

        public String getCa() {
            return ca;
        }

        public void setCa(String ca) {
            this.ca = ca;
        }

        public String getCert() {
            return cert;
        }

        public void setCert(String cert) {
            this.cert = cert;
        }

        public String getKey() {
            return key;
        }

        public void setKey(String key) {
            this.key = key;
        }
    }

    /** One database: its JDBC URL and credentials, the server's {@code [[rm]]} name for it, and its pool. */
    public static class DataSourceSpec {
        private String url;
        private String username;
        private String password;
        /** The server's [[rm]] name of this database (default: the bean name). */
        private String rm;
        private int maxPoolSize = 10;
        private Duration acquireTimeout = Duration.ofSeconds(30);
        /** Whether this DataSource is the primary one (the first is, when none says so). */
        private Boolean primary;

        public String getUrl() {
            return url;
        }

        public void setUrl(String url) {
            this.url = url;
        }

        public String getUsername() {
            return username;
        }

        public void setUsername(String username) {
            this.username = username;
        }

        public String getPassword() {
            return password;
        }

        public void setPassword(String password) {
            this.password = password;
        }

        public String getRm() {
            return rm;
        }

        public void setRm(String rm) {
            this.rm = rm;
        }

        public int getMaxPoolSize() {
            return maxPoolSize;
        }

        public void setMaxPoolSize(int maxPoolSize) {
            this.maxPoolSize = maxPoolSize;
        }

        public Duration getAcquireTimeout() {
            return acquireTimeout;
        }

        public void setAcquireTimeout(Duration acquireTimeout) {
            this.acquireTimeout = acquireTimeout;
        }

        public Boolean getPrimary() {
            return primary;
        }

        public void setPrimary(Boolean primary) {
            this.primary = primary;
        }
    }

    public String getEndpoint() {
        return endpoint;
    }

    public void setEndpoint(String endpoint) {
        this.endpoint = endpoint;
    }

    public String getClientName() {
        return clientName;
    }

    public void setClientName(String clientName) {
        this.clientName = clientName;
    }

    public long getNodeExpected() {
        return nodeExpected;
    }

    public void setNodeExpected(long nodeExpected) {
        this.nodeExpected = nodeExpected;
    }

    public Duration getReplyTimeout() {
        return replyTimeout;
    }

    public void setReplyTimeout(Duration replyTimeout) {
        this.replyTimeout = replyTimeout;
    }

    public Duration getOutcomeTimeout() {
        return outcomeTimeout;
    }

    public void setOutcomeTimeout(Duration outcomeTimeout) {
        this.outcomeTimeout = outcomeTimeout;
    }

    public Duration getDefaultTimeout() {
        return defaultTimeout;
    }

    public void setDefaultTimeout(Duration defaultTimeout) {
        this.defaultTimeout = defaultTimeout;
    }

    public Tls getTls() {
        return tls;
    }

    public Map<String, DataSourceSpec> getDatasource() {
        return datasource;
    }
}
