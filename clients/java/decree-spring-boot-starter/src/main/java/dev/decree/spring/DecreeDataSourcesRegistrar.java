package dev.decree.spring;

import dev.decree.jta.DecreeDataSource;
import dev.decree.jta.DecreeTransactionManager;
import java.util.Map;
import java.util.Properties;
import org.springframework.beans.factory.BeanFactory;
import org.springframework.beans.factory.BeanFactoryAware;
import org.springframework.beans.factory.support.BeanDefinitionRegistry;
import org.springframework.beans.factory.support.RootBeanDefinition;
import org.springframework.boot.context.properties.bind.Bindable;
import org.springframework.boot.context.properties.bind.Binder;
import org.springframework.context.EnvironmentAware;
import org.springframework.context.annotation.ImportBeanDefinitionRegistrar;
import org.springframework.core.env.Environment;
import org.springframework.core.type.AnnotationMetadata;

/** One {@link DecreeDataSource} bean per {@code decree.datasource.<name>} entry, named {@code <name>}. */
class DecreeDataSourcesRegistrar implements ImportBeanDefinitionRegistrar, EnvironmentAware, BeanFactoryAware {
    private Environment environment;
    private BeanFactory beanFactory;

    @Override
    public void setEnvironment(Environment environment) {
        this.environment = environment;
    }

    @Override
    public void setBeanFactory(BeanFactory beanFactory) {
        this.beanFactory = beanFactory;
    }

    @Override
    public void registerBeanDefinitions(AnnotationMetadata metadata, BeanDefinitionRegistry registry) {
        Map<String, DecreeProperties.DataSourceSpec> specs = Binder.get(environment)
                .bind("decree.datasource", Bindable.mapOf(String.class, DecreeProperties.DataSourceSpec.class)).orElse(Map.of());
        boolean anyPrimary = specs.values().stream().anyMatch(s -> Boolean.TRUE.equals(s.getPrimary()));
        boolean first = true;
        for (Map.Entry<String, DecreeProperties.DataSourceSpec> e : specs.entrySet()) {
            String name = e.getKey();
            DecreeProperties.DataSourceSpec spec = e.getValue();
            if (spec.getUrl() == null) {
                throw new IllegalStateException("decree.datasource." + name + ".url is missing");
            }
            if (registry.containsBeanDefinition(name)) {
                continue;
            }
            RootBeanDefinition def = new RootBeanDefinition(DecreeDataSource.class, () -> {
                Properties p = new Properties();
                if (spec.getUsername() != null) {
                    p.setProperty("user", spec.getUsername());
                }
                if (spec.getPassword() != null) {
                    p.setProperty("password", spec.getPassword());
                }
                DecreeDataSource ds = new DecreeDataSource(beanFactory.getBean(DecreeTransactionManager.class),
                        spec.getRm() != null ? spec.getRm() : name, spec.getUrl(), p, spec.getMaxPoolSize());
                ds.setAcquireTimeoutMillis(spec.getAcquireTimeout().toMillis());
                return ds;
            });
            def.setDestroyMethodName("close");
            def.setPrimary(anyPrimary ? Boolean.TRUE.equals(spec.getPrimary()) : first);
            registry.registerBeanDefinition(name, def);
            first = false;
        }
    }
}
