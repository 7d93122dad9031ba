package dev.decree.spring;

import dev.decree.jta.DecreeTransactionManager;
import dev.decree.jta.Endpoint;
import dev.decree.jta.SessionOptions;
import dev.decree.jta.Tls;
import jakarta.transaction.SystemException;
import java.nio.file.Path;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Import;
import org.springframework.transaction.TransactionManager;
import org.springframework.transaction.jta.JtaTransactionManager;
import org.springframework.util.ClassUtils;

/**
 * Gives a Spring Boot application decree's JTA transaction manager when {@code decree.endpoint}
 * is set: a {@link DecreeTransactionManager}, Spring's {@link JtaTransactionManager} over it
 * (so {@code @Transactional} spans every enlisted database), one pooled, XA-enlisting
 * {@code DataSource} per {@code decree.datasource.<name>} entry, and, with Hibernate on the
 * class path, {@link DecreeJtaPlatform} as the default platform. Runs before Boot's own
 * DataSource, JPA and transaction auto-configurations, which then back off.
 */
@AutoConfiguration(beforeName = {
    "org.springframework.boot.transaction.jta.autoconfigure.JtaAutoConfiguration",
    "org.springframework.boot.transaction.autoconfigure.TransactionAutoConfiguration",
    "org.springframework.boot.jdbc.autoconfigure.DataSourceAutoConfiguration",
    "org.springframework.boot.jdbc.autoconfigure.DataSourceTransactionManagerAutoConfiguration",
    "org.springframework.boot.hibernate.autoconfigure.HibernateJpaAutoConfiguration"})
@ConditionalOnClass(JtaTransactionManager.class)
@ConditionalOnProperty(prefix = "decree", name = "endpoint")
@EnableConfigurationProperties(DecreeProperties.class)
@Import(DecreeDataSourcesRegistrar.class)
public class DecreeAutoConfiguration {
    @Bean(destroyMethod = "close")
    @ConditionalOnMissingBean
    public DecreeTransactionManager decreeTransactionManager(DecreeProperties p) throws SystemException {
        SessionOptions options = SessionOptions.defaults().withClientName(p.getClientName()).withNodeExpected(p.getNodeExpected())
                .withReplyTimeoutMs(p.getReplyTimeout().toMillis());
        DecreeProperties.Tls tls = p.getTls();
        if (tls.getCa() != null || tls.getCert() != null) {
            options = options.withSslContext(Tls.context(Path.of(tls.getCa()), Path.of(tls.getCert()), Path.of(tls.getKey())));
        }
        DecreeTransactionManager tm = new DecreeTransactionManager(Endpoint.parseList(p.getEndpoint()), options);
        tm.setOutcomeTimeoutMillis(p.getOutcomeTimeout().toMillis());
        tm.setDefaultTransactionTimeout((int) p.getDefaultTimeout().toSeconds());
        if (ClassUtils.isPresent("org.hibernate.engine.transaction.jta.platform.spi.JtaPlatform", getClass().getClassLoader())) {
            DecreeJtaPlatform.use(tm);
        }
        return tm;
    }

    @Bean
    @ConditionalOnMissingBean(TransactionManager.class)
    public JtaTransactionManager transactionManager(DecreeTransactionManager tm, ObjectProvider<JtaTransactionManagerCustomizer> customizers) {
        JtaTransactionManager jta = new JtaTransactionManager(tm, tm);
        jta.setTransactionSynchronizationRegistry(tm.getSynchronizationRegistry());
        customizers.orderedStream().forEach(c -> c.customize(jta));
        return jta;
    }

    /** Changes the {@link JtaTransactionManager} the auto-configuration makes. */
    @FunctionalInterface
    public interface JtaTransactionManagerCustomizer {
        void customize(JtaTransactionManager jta);
    }
}
