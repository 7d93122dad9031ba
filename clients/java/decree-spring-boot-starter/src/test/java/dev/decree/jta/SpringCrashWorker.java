package dev.decree.jta;

import dev.decree.spring.bank.BankApplication;
import org.springframework.boot.SpringApplication;
import org.springframework.context.ConfigurableApplicationContext;

/**
 * The child JVM of SpringCrashTest: starts the bank application (its properties as
 * arguments), runs one {@code @Transactional} transfer and, at the commit step it is told,
 * prints {@code STEP <step> <xid>} and waits to be killed. Arguments: step, transfer id, then
 * the application's {@code --name=value} properties.
 */
public final class SpringCrashWorker {
    private SpringCrashWorker() {}

    public static void main(String[] args) {
        String step = args[0];
        String transfer = args[1];
        String[] props = java.util.Arrays.copyOfRange(args, 2, args.length);
        ConfigurableApplicationContext ctx = SpringApplication.run(BankApplication.class, props);
        CrashWorker.stopAt(step);
        ctx.getBean(BankApplication.Transfers.class).move(transfer, 10);
        System.out.println("COMMITTED " + transfer);
        System.out.flush();
        System.exit(0);
    }
}
