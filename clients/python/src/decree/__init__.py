"""decree: atomic commits across databases, coordinated by the application and made
durable by the decree state server (``decree serve``).

Start with :func:`connect`; docs/guide.md walks through a complete program and
docs/protocol.md is the protocol this package implements.
"""

from ._pairs import UnknownNode
from .aio import AsyncTransaction, AsyncTransactionManager, aconnect
from .aio_branches import AsyncBranchAdapter, AsyncMySQLBranch, AsyncPsycopgBranch
from .aio_connection import AsyncServerConnection
from .aio_pairs import AsyncPairsManager, aconnect_pairs
from .branches import (
    BranchAdapter,
    BranchEnded,
    BranchFailed,
    BranchInDoubt,
    PhaseTwo,
    PsycopgBranch,
    PyMySQLBranch,
    Step,
)
from .connection import Endpoint, Options, ServerConnection, TlsConfig, __version__
from .errors import (
    BranchEndedByApplication,
    DecreeError,
    HeuristicError,
    HeuristicReport,
    OutcomeUnknown,
    ProtocolError,
    RolledBack,
    ServerError,
    Unavailable,
    UsageError,
)
from .protocol import ErrorCode, Heuristic, Outcome, Xid
from .pairs import PairsManager, connect_pairs
from .tm import CommitReport, Transaction, TransactionManager, connect

__all__ = [
    "AsyncBranchAdapter",
    "AsyncPairsManager",
    "AsyncMySQLBranch",
    "AsyncPsycopgBranch",
    "AsyncServerConnection",
    "AsyncTransaction",
    "AsyncTransactionManager",
    "BranchAdapter",
    "BranchEnded",
    "BranchEndedByApplication",
    "BranchFailed",
    "BranchInDoubt",
    "CommitReport",
    "DecreeError",
    "Endpoint",
    "ErrorCode",
    "Heuristic",
    "HeuristicError",
    "HeuristicReport",
    "Options",
    "Outcome",
    "PairsManager",
    "OutcomeUnknown",
    "PhaseTwo",
    "ProtocolError",
    "PsycopgBranch",
    "PyMySQLBranch",
    "RolledBack",
    "ServerConnection",
    "ServerError",
    "Step",
    "TlsConfig",
    "Transaction",
    "TransactionManager",
    "Unavailable",
    "UnknownNode",
    "UsageError",
    "Xid",
    "__version__",
    "aconnect",
    "aconnect_pairs",
    "connect",
    "connect_pairs",
]
