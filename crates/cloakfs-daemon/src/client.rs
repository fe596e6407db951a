//! The client side of the control protocol: what `cloakfs attach`, `auth`, ... use.

use crate::lines::{Line, LineReader};
use crate::protocol::{Request, Response, MAX_MESSAGE};
use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use zeroize::Zeroizing;

/// A connection to the daemon; several requests may be sent in sequence.
pub struct Client {
    stream: UnixStream,
    lines: LineReader<UnixStream>,
}

impl Client {
    /// Connects to the daemon's socket. A missing or dead socket gives an error that says
    /// how to start the daemon.
    pub fn connect(socket: &Path) -> io::Result<Client> {
        let stream = UnixStream::connect(socket).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => io::Error::new(
                e.kind(),
                format!(
                    "no cloakfs daemon at {} (start it with `cloakfs daemon`)",
                    socket.display()
                ),
            ),
            _ => io::Error::new(e.kind(), format!("{}: {e}", socket.display())),
        })?;
        let lines = LineReader::new(stream.try_clone()?, MAX_MESSAGE);
        Ok(Client { stream, lines })
    }

    /// Sends one request and reads its answer.
    pub fn call(&mut self, req: &Request) -> io::Result<Response> {
        let mut text = Zeroizing::new(serde_json::to_vec(req).map_err(io::Error::other)?);
        text.push(b'\n');
        if let Err(e) = self.stream.write_all(&text) {
            // A daemon that turns a connection away says why at once and closes it: the
            // write may fail before the reason is read.
            return match self.lines.next_line() {
                Ok(Line::Message(m)) => serde_json::from_slice(&m).map_err(|_| e),
                _ => Err(e),
            };
        }
        match self.lines.next_line()? {
            Line::Message(m) => serde_json::from_slice(&m).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad answer from the daemon: {e}"),
                )
            }),
            Line::Eof => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the daemon closed the connection",
            )),
            Line::TooLong => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "answer from the daemon is too long",
            )),
        }
    }
}
