package dev.decree.spring.bank;

import dev.decree.spring.DecreeJtaPlatform;
import dev.decree.spring.bank.a.EntryA;
import dev.decree.spring.bank.b.EntryB;
import jakarta.persistence.EntityManager;
import jakarta.persistence.PersistenceContext;
import java.util.Map;
import javax.sql.DataSource;
import org.springframework.beans.factory.annotation.Qualifier;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.context.annotation.Bean;
import org.springframework.orm.jpa.LocalContainerEntityManagerFactoryBean;
import org.springframework.orm.jpa.vendor.HibernateJpaVendorAdapter;
import org.springframework.stereotype.Service;
import org.springframework.transaction.annotation.Transactional;

/**
 * A Spring Boot application with two databases and JPA entities in both: the DataSources
 * {@code a} and {@code b} come from {@code decree.datasource.*}, each gets its own JTA
 * persistence unit, and {@code @Transactional} spans both through decree.
 */
@SpringBootApplication
public class BankApplication {
    public static void main(String[] args) {
        SpringApplication.run(BankApplication.class, args);
    }

    static LocalContainerEntityManagerFactoryBean unit(String name, DataSource ds, Class<?> entity) {
        LocalContainerEntityManagerFactoryBean f = new LocalContainerEntityManagerFactoryBean();
        f.setPersistenceUnitName(name);
        f.setJtaDataSource(ds);
        f.setPackagesToScan(entity.getPackageName());
        f.setJpaVendorAdapter(new HibernateJpaVendorAdapter());
        f.setJpaPropertyMap(Map.of("hibernate.transaction.jta.platform", DecreeJtaPlatform.class.getName(),
                "jakarta.persistence.transactionType", "JTA", "hibernate.hbm2ddl.auto", "update"));
        return f;
    }

    @Bean
    LocalContainerEntityManagerFactoryBean a(@Qualifier("bankA") DataSource ds) {
        return unit("a", ds, EntryA.class);
    }

    @Bean
    LocalContainerEntityManagerFactoryBean b(@Qualifier("bankB") DataSource ds) {
        return unit("b", ds, EntryB.class);
    }

    /** Moves money from database A to database B. */
    @Service
    public static class Transfers {
        @PersistenceContext(unitName = "a")
        private EntityManager a;

        @PersistenceContext(unitName = "b")
        private EntityManager b;

        @Transactional
        public void move(String id, long amount) {
            a.persist(new EntryA(id, -amount));
            b.persist(new EntryB(id, amount));
        }

        @Transactional
        public void moveThenFail(String id, long amount) {
            move(id, amount);
            a.flush();
            b.flush();
            throw new IllegalStateException("the application fails after writing both databases");
        }

        @Transactional(readOnly = true)
        public boolean inA(String id) {
            return a.find(EntryA.class, id) != null;
        }

        @Transactional(readOnly = true)
        public boolean inB(String id) {
            return b.find(EntryB.class, id) != null;
        }
    }
}
