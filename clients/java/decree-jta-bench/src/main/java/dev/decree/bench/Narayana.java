package dev.decree.bench;

import com.arjuna.ats.arjuna.common.ObjectStoreEnvironmentBean;
import com.arjuna.ats.internal.arjuna.objectstore.hornetq.HornetqJournalEnvironmentBean;
import com.arjuna.ats.internal.arjuna.objectstore.hornetq.HornetqObjectStoreAdaptor;
import com.arjuna.ats.internal.arjuna.objectstore.slot.DiskSlots;
import com.arjuna.ats.internal.arjuna.objectstore.slot.SlotStoreAdaptor;
import com.arjuna.ats.internal.arjuna.objectstore.slot.SlotStoreEnvironmentBean;
import com.arjuna.common.internal.util.propertyservice.BeanPopulator;
import jakarta.transaction.TransactionManager;
import java.nio.file.Path;

/** Narayana with a durable store: its slot store or its journal (Artemis journal, NIO), both syncing every write. */
final class Narayana {
    private Narayana() {}

    static TransactionManager start(boolean slots, Path dir) {
        for (String name : new String[] {null, "communicationStore", "stateStore"}) {
            ObjectStoreEnvironmentBean b = name == null ? BeanPopulator.getDefaultInstance(ObjectStoreEnvironmentBean.class)
                    : BeanPopulator.getNamedInstance(ObjectStoreEnvironmentBean.class, name);
            b.setObjectStoreDir(dir.resolve("os").toString());
            if (name == null) {
                b.setObjectStoreType(slots ? SlotStoreAdaptor.class.getName() : HornetqObjectStoreAdaptor.class.getName());
            }
        }
        if (slots) {
            SlotStoreEnvironmentBean s = BeanPopulator.getDefaultInstance(SlotStoreEnvironmentBean.class);
            s.setStoreDir(dir.resolve("slots").toString());
            s.setBackingSlotsClassName(DiskSlots.class.getName()); // the default keeps the slots in memory only
            s.setSyncWrites(true);
            s.setSyncDeletes(true);
        } else {
            HornetqJournalEnvironmentBean j = BeanPopulator.getDefaultInstance(HornetqJournalEnvironmentBean.class);
            j.setStoreDir(dir.resolve("journal").toString());
            j.setSyncWrites(true);
            j.setSyncDeletes(true);
            j.setAsyncIO(false);
        }
        return com.arjuna.ats.jta.TransactionManager.transactionManager();
    }
}
