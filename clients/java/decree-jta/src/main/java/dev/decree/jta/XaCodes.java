package dev.decree.jta;

import javax.transaction.xa.XAException;

/** Names of XAException codes, for messages. */
final class XaCodes {
    private XaCodes() {}

    static boolean isRollback(int code) {
        return code >= XAException.XA_RBBASE && code <= XAException.XA_RBEND;
    }

    static String name(XAException e) {
        String n = switch (e.errorCode) {
            case XAException.XA_RBROLLBACK -> "XA_RBROLLBACK";
            case XAException.XA_RBCOMMFAIL -> "XA_RBCOMMFAIL";
            case XAException.XA_RBDEADLOCK -> "XA_RBDEADLOCK";
            case XAException.XA_RBINTEGRITY -> "XA_RBINTEGRITY";
            case XAException.XA_RBOTHER -> "XA_RBOTHER";
            case XAException.XA_RBPROTO -> "XA_RBPROTO";
            case XAException.XA_RBTIMEOUT -> "XA_RBTIMEOUT";
            case XAException.XA_RBTRANSIENT -> "XA_RBTRANSIENT";
            case XAException.XA_HEURCOM -> "XA_HEURCOM";
            case XAException.XA_HEURRB -> "XA_HEURRB";
            case XAException.XA_HEURMIX -> "XA_HEURMIX";
            case XAException.XA_HEURHAZ -> "XA_HEURHAZ";
            case XAException.XA_RETRY -> "XA_RETRY";
            case XAException.XA_RDONLY -> "XA_RDONLY";
            case XAException.XAER_ASYNC -> "XAER_ASYNC";
            case XAException.XAER_RMERR -> "XAER_RMERR";
            case XAException.XAER_NOTA -> "XAER_NOTA";
            case XAException.XAER_INVAL -> "XAER_INVAL";
            case XAException.XAER_PROTO -> "XAER_PROTO";
            case XAException.XAER_RMFAIL -> "XAER_RMFAIL";
            case XAException.XAER_DUPID -> "XAER_DUPID";
            case XAException.XAER_OUTSIDE -> "XAER_OUTSIDE";
            default -> "XA code " + e.errorCode;
        };
        return e.getMessage() == null ? n : n + ": " + e.getMessage();
    }

    static XAException of(int code, String message, Throwable cause) {
        XAException e = new XAException(message);
        e.errorCode = code;
        if (cause != null) {
            e.initCause(cause);
        }
        return e;
    }
}
