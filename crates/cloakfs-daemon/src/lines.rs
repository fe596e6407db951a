//! Newline-framed messages with a size limit, read into a buffer that is wiped (messages
//! may carry keys).

use std::io::{self, Read};
use zeroize::Zeroizing;

/// What one read produced.
#[derive(Debug)]
pub enum Line {
    /// A complete message, without its newline.
    Message(Zeroizing<Vec<u8>>),
    /// The peer closed the connection (nothing pending).
    Eof,
    /// A message longer than the limit: the stream cannot be resynchronised.
    TooLong,
}

pub struct LineReader<R> {
    inner: R,
    buf: Zeroizing<Vec<u8>>,
    /// `buf[..scanned]` holds no newline: each byte is searched once, so a long message
    /// costs time in proportion to its length.
    scanned: usize,
    max: usize,
}

/// Bytes asked of the reader at a time.
const CHUNK: usize = 16 * 1024;

impl<R: Read> LineReader<R> {
    pub fn new(inner: R, max: usize) -> Self {
        Self {
            inner,
            buf: Zeroizing::new(Vec::with_capacity(4096)),
            scanned: 0,
            max,
        }
    }

    /// Bytes read but not yet returned as a message (the start of the next one).
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The reader underneath.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// The next message. A final message without a newline counts as a message.
    pub fn next_line(&mut self) -> io::Result<Line> {
        let mut chunk = Zeroizing::new([0u8; CHUNK]);
        loop {
            let start = self.scanned;
            self.scanned = self.buf.len();
            if let Some(at) = self.buf[start..].iter().position(|&b| b == b'\n') {
                let i = start + at;
                if i > self.max {
                    return Ok(Line::TooLong);
                }
                let mut msg = Zeroizing::new(self.buf[..i].to_vec());
                self.buf.drain(..=i);
                self.scanned = 0;
                if msg.last() == Some(&b'\r') {
                    msg.pop();
                }
                return Ok(Line::Message(msg));
            }
            if self.buf.len() > self.max {
                return Ok(Line::TooLong);
            }
            let n = match self.inner.read(&mut chunk[..]) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if n == 0 {
                if self.buf.is_empty() {
                    return Ok(Line::Eof);
                }
                let msg = Zeroizing::new(self.buf.to_vec());
                self.buf.clear();
                self.scanned = 0;
                return Ok(Line::Message(msg));
            }
            // Grow without leaving stale copies behind: reserve in a wiped buffer.
            if self.buf.capacity() < self.buf.len() + n {
                let mut bigger = Zeroizing::new(Vec::with_capacity((self.buf.len() + n) * 2));
                bigger.extend_from_slice(&self.buf);
                self.buf = bigger;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], max: usize) -> Vec<String> {
        let mut r = LineReader::new(input, max);
        let mut out = Vec::new();
        loop {
            match r.next_line().unwrap() {
                Line::Message(m) => out.push(String::from_utf8_lossy(&m).into_owned()),
                Line::Eof => break,
                Line::TooLong => {
                    out.push("<too long>".into());
                    break;
                }
            }
        }
        out
    }

    /// A reader that hands out `n` bytes at a time.
    struct Trickle<'a>(&'a [u8], usize);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.1.min(buf.len()).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn framing_across_reads_of_any_size() {
        let mut input = b"first\nsecond\r\n".to_vec();
        input.extend(vec![b'z'; 50_000]);
        input.extend(b"\nlast");
        for step in [1, 2, 3, 7, 4096, 100_000] {
            let mut r = LineReader::new(Trickle(&input, step), 60_000);
            let mut got = Vec::new();
            while let Line::Message(m) = r.next_line().unwrap() {
                got.push(m.len());
            }
            assert_eq!(got, [5, 6, 50_000, 4], "step {step}");
        }
    }

    #[test]
    fn framing() {
        assert_eq!(lines(b"a\nbc\r\n\nd", 10), ["a", "bc", "", "d"]);
        assert_eq!(lines(b"", 10), Vec::<String>::new());
        assert_eq!(lines(b"0123456789\nx\n", 10), ["0123456789", "x"]);
        assert_eq!(lines(b"0123456789A\nx\n", 10), ["<too long>"]);
        let big = vec![b'y'; 100_000];
        assert_eq!(lines(&big, 10), ["<too long>"]);
        let mut ok = vec![b'z'; 9000];
        ok.push(b'\n');
        assert_eq!(lines(&ok, 10_000)[0].len(), 9000);
    }
}
