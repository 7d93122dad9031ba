package dev.decree.spring.bank.a;

import dev.decree.spring.bank.Entry;
import jakarta.persistence.Entity;
import jakarta.persistence.Table;

/** A ledger entry in database A (the persistence unit a scans this package). */
@Entity
@Table(name = "decree_spring_entry")
public class EntryA extends Entry {
    protected EntryA() {}

    public EntryA(String id, long amount) {
        super(id, amount);
    }
}
