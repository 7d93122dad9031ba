package dev.decree.jta;

/** The error codes of docs/protocol.md, "Errors". */
public final class ErrorCodes {
    private ErrorCodes() {}

    public static final int MALFORMED = 1, FRAME_TOO_LARGE = 2, UNKNOWN_TYPE = 3, VERSION = 4, PROTOCOL = 5, LOG_FAILED = 6,
            WRONG_SESSION = 7, NODE_MISMATCH = 8, SHUTTING_DOWN = 9, BUSY = 10, UNKNOWN_RM = 11, BRANCH_QUALIFIER = 12,
            DUPLICATE_BRANCH = 13, NO_BRANCHES = 14, OUTCOME_UNKNOWN = 15, OUTCOME_HEURISTIC = 16, NOT_ALLOWED = 17,
            TLS_REQUIRED = 18, NOT_PRIMARY = 19, MUST_UNDERSTAND = 20, NOT_KEPT = 21;

    /** Errors after which the connection stays open (the others close it). */
    static boolean keepsConnection(int code) {
        return code == LOG_FAILED || code == WRONG_SESSION || (code >= UNKNOWN_RM && code <= OUTCOME_HEURISTIC)
                || code == MUST_UNDERSTAND || code == NOT_KEPT;
    }

    /** A Decide refused before anything was written: not decided. */
    static boolean refusedBeforeWriting(int code) {
        return code == WRONG_SESSION || code == UNKNOWN_RM || code == BRANCH_QUALIFIER || code == DUPLICATE_BRANCH
                || code == NO_BRANCHES || code == MUST_UNDERSTAND;
    }

    public static String name(int code) {
        return switch (code) {
            case MALFORMED -> "Malformed";
            case FRAME_TOO_LARGE -> "FrameTooLarge";
            case UNKNOWN_TYPE -> "UnknownType";
            case VERSION -> "Version";
            case PROTOCOL -> "Protocol";
            case LOG_FAILED -> "LogFailed";
            case WRONG_SESSION -> "WrongSession";
            case NODE_MISMATCH -> "NodeMismatch";
            case SHUTTING_DOWN -> "ShuttingDown";
            case BUSY -> "Busy";
            case UNKNOWN_RM -> "UnknownRm";
            case BRANCH_QUALIFIER -> "BranchQualifier";
            case DUPLICATE_BRANCH -> "DuplicateBranch";
            case NO_BRANCHES -> "NoBranches";
            case OUTCOME_UNKNOWN -> "OutcomeUnknown";
            case OUTCOME_HEURISTIC -> "OutcomeHeuristic";
            case NOT_ALLOWED -> "NotAllowed";
            case TLS_REQUIRED -> "TlsRequired";
            case NOT_PRIMARY -> "NotPrimary";
            case MUST_UNDERSTAND -> "MustUnderstand";
            case NOT_KEPT -> "NotKept";
            default -> "unknown code";
        };
    }
}
