//! A blocking PostgreSQL client whose statements can also be sent now and answered later.
//!
//! The `postgres` crate's client waits for each answer before it returns, so a session with
//! two PostgreSQL branches paid each step's round trips one after the other. This client is
//! built the same way (tokio-postgres, its connection driven by a current-thread runtime
//! that the connection owns and that runs only while a call waits) and adds one thing:
//! [`Client::send`] queues a statement, writes it to the socket and returns at once with a
//! [`Sent`], which [`Client::receive`] turns into the answer later. The coordinator sends
//! to every branch and then receives each answer, so the databases work at the same time
//! with no helper thread and no hand-off.
//!
//! [`Client::queue`] goes one step less: it queues a statement without writing it, so the
//! next call that drives the connection writes both in one write (the resource manager's
//! `BEGIN` rides with the application's first statement this way).
//!
//! The application's methods (`execute`, `query`, `query_one`, `query_opt`, `prepare`,
//! `simple_query`, `batch_execute`) keep the `postgres` crate's names and types.
//!
//! Invariants: the connection is polled only inside this client's calls, on the caller's
//! thread; once it has ended (server gone, IO error) it is dropped, which fails every
//! pending and later request at once instead of leaving it waiting.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use tokio::runtime::Runtime;
use tokio_postgres::tls::NoTlsStream;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Connection, NoTls, Socket, ToStatement};

pub use tokio_postgres::{Config, Error, Row, SimpleQueryMessage, Statement};

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The runtime that drives the connection could not be built.
    #[error("cannot start the connection's runtime: {0}")]
    Runtime(#[from] std::io::Error),
    /// The server could not be reached or refused the session.
    #[error("{0}")]
    Postgres(#[from] Error),
}

/// The answer of a statement sent with [`Client::send`].
type Answer = Result<Vec<SimpleQueryMessage>, Error>;

/// A statement in flight: its answer is taken with [`Client::receive`].
pub struct Sent {
    state: SentState,
}

enum SentState {
    /// Waiting for the server.
    Waiting(Pin<Box<dyn Future<Output = Answer> + Send>>),
    /// Answered already (an early failure, such as a closed connection).
    Done(Answer),
}

/// The connection's driver: its runtime and the connection future, until it ends.
struct Driver {
    runtime: Runtime,
    connection: Option<Pin<Box<Connection<Socket, NoTlsStream>>>>,
}

impl Driver {
    /// Polls `request` and the connection until the request is answered.
    fn block_on<T>(&mut self, request: impl Future<Output = Result<T, Error>>) -> Result<T, Error> {
        let mut request = std::pin::pin!(request);
        let Driver { runtime, connection } = self;
        runtime.block_on(poll_fn(|cx| {
            if let Poll::Ready(answer) = request.as_mut().poll(cx) {
                return Poll::Ready(answer);
            }
            if let Some(conn) = connection.as_mut() {
                match conn.as_mut().poll(cx) {
                    Poll::Pending => {}
                    Poll::Ready(result) => {
                        // Dropping the ended connection fails the request's wait.
                        *connection = None;
                        if let Err(e) = result {
                            return Poll::Ready(Err(e));
                        }
                    }
                }
                // The connection may have delivered the answer.
                return request.as_mut().poll(cx);
            }
            request.as_mut().poll(cx)
        }))
    }

    /// Polls `request` once without the connection: a first poll queues its message
    /// (tokio-postgres sends on the first poll), a later one takes an answer the connection
    /// has already delivered. Never waits.
    fn poll_request<T>(&mut self, mut request: Pin<&mut (dyn Future<Output = T> + Send)>) -> Poll<T> {
        self.runtime.block_on(poll_fn(|cx| Poll::Ready(request.as_mut().poll(cx))))
    }

    /// Polls the connection once, which writes every queued message to the socket; never
    /// waits. A connection found ended is dropped: the next wait reports it.
    fn flush(&mut self) {
        let Driver { runtime, connection } = self;
        runtime.block_on(poll_fn(|cx| {
            if let Some(conn) = connection.as_mut() {
                if conn.as_mut().poll(cx).is_ready() {
                    *connection = None;
                }
            }
            Poll::Ready(())
        }))
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The client was dropped first (field order in `Client`): one poll lets the
        // connection send Terminate so the server ends the session at once.
        if let Some(mut conn) = self.connection.take() {
            self.runtime.block_on(poll_fn(|cx| {
                let _ = conn.as_mut().poll(cx);
                Poll::Ready(())
            }));
        }
    }
}

/// A synchronous PostgreSQL client with split-phase statements (see the module doc).
pub struct Client {
    // Dropped before `driver`, see `Driver::drop`.
    client: Arc<tokio_postgres::Client>,
    driver: Driver,
}

impl Client {
    /// Opens a connection as `config` says (TCP or Unix socket, no TLS).
    pub fn connect(config: &Config) -> Result<Client, ConnectError> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let (client, connection) = runtime.block_on(config.connect(NoTls))?;
        Ok(Client {
            client: Arc::new(client),
            driver: Driver { runtime, connection: Some(Box::pin(connection)) },
        })
    }

    /// True once the connection has ended; the client is then of no further use.
    pub fn is_closed(&self) -> bool {
        self.driver.connection.is_none() || self.client.is_closed()
    }

    /// Executes a statement, returning the number of rows it changed.
    pub fn execute<T>(&mut self, query: &T, params: &[&(dyn ToSql + Sync)]) -> Result<u64, Error>
    where
        T: ?Sized + ToStatement,
    {
        let Client { client, driver } = self;
        driver.block_on(client.execute(query, params))
    }

    /// Runs a query, returning its rows.
    pub fn query<T>(&mut self, query: &T, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, Error>
    where
        T: ?Sized + ToStatement,
    {
        let Client { client, driver } = self;
        driver.block_on(client.query(query, params))
    }

    /// Runs a query that returns exactly one row.
    pub fn query_one<T>(&mut self, query: &T, params: &[&(dyn ToSql + Sync)]) -> Result<Row, Error>
    where
        T: ?Sized + ToStatement,
    {
        let Client { client, driver } = self;
        driver.block_on(client.query_one(query, params))
    }

    /// Runs a query that returns at most one row.
    pub fn query_opt<T>(&mut self, query: &T, params: &[&(dyn ToSql + Sync)]) -> Result<Option<Row>, Error>
    where
        T: ?Sized + ToStatement,
    {
        let Client { client, driver } = self;
        driver.block_on(client.query_opt(query, params))
    }

    /// Prepares a statement for repeated execution on this connection.
    pub fn prepare(&mut self, query: &str) -> Result<Statement, Error> {
        let Client { client, driver } = self;
        driver.block_on(client.prepare(query))
    }

    /// Runs one or more statements with the simple query protocol, returning their rows.
    pub fn simple_query(&mut self, query: &str) -> Result<Vec<SimpleQueryMessage>, Error> {
        let Client { client, driver } = self;
        driver.block_on(client.simple_query(query))
    }

    /// Runs one or more statements with the simple query protocol, discarding any rows.
    pub fn batch_execute(&mut self, query: &str) -> Result<(), Error> {
        let Client { client, driver } = self;
        driver.block_on(client.batch_execute(query))
    }

    /// Sends `query` (simple query protocol) and returns without its answer; take it with
    /// [`Client::receive`]. Statements sent on one connection are answered in order.
    pub fn send(&mut self, query: String) -> Sent {
        let sent = self.queue(query);
        self.driver.flush();
        sent
    }

    /// Queues `query` (simple query protocol) without writing it: the next call that drives
    /// the connection (the application's next statement, or [`Client::receive`]) writes it
    /// ahead of its own, in one write, and the server runs both in order. Take its answer
    /// with [`Client::receive`].
    pub fn queue(&mut self, query: String) -> Sent {
        let client = Arc::clone(&self.client);
        let mut request: Pin<Box<dyn Future<Output = Answer> + Send>> =
            Box::pin(async move { client.simple_query(&query).await });
        let polled = self.driver.poll_request(request.as_mut());
        let state = match polled {
            Poll::Ready(answer) => SentState::Done(answer),
            Poll::Pending => SentState::Waiting(request),
        };
        Sent { state }
    }

    /// True once the answer of `sent` has arrived (never waits, never drives the
    /// connection): a later statement's wait read it from the socket.
    pub fn is_answered(&mut self, sent: &mut Sent) -> bool {
        if let SentState::Waiting(request) = &mut sent.state {
            if let Poll::Ready(answer) = self.driver.poll_request(request.as_mut()) {
                sent.state = SentState::Done(answer);
            }
        }
        matches!(sent.state, SentState::Done(_))
    }

    /// Waits for the answer to a statement sent with [`Client::send`] or [`Client::queue`] on
    /// this client.
    pub fn receive(&mut self, sent: Sent) -> Answer {
        match sent.state {
            SentState::Done(answer) => answer,
            SentState::Waiting(request) => self.driver.block_on(request),
        }
    }
}
