//! Finds secrets in a live process: every copy of given byte strings in its readable memory
//! (read through /proc/PID/mem), with the mapping that holds it (from /proc/PID/smaps).
//! Shared by the core's and the CLI's locked-memory tests.

#![allow(dead_code)]

use cloakfs_core::crypto::secret::SecretBytes;
use std::os::unix::fs::FileExt;

/// One mapping of /proc/PID/smaps.
#[derive(Debug, Clone)]
pub struct Vma {
    pub start: usize,
    pub end: usize,
    pub perms: String,
    pub name: String,
    pub flags: Vec<String>,
    pub locked_kb: u64,
}

impl Vma {
    /// Locked into RAM (mlock).
    pub fn locked(&self) -> bool {
        self.flags.iter().any(|f| f == "lo")
    }

    /// Left out of core dumps (MADV_DONTDUMP).
    pub fn dont_dump(&self) -> bool {
        self.flags.iter().any(|f| f == "dd")
    }
}

/// The mappings of process `pid` ("self" for this one).
pub fn vmas(pid: &str) -> Vec<Vma> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut out: Vec<Vma> = Vec::new();
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(start), Ok(end)) =
                (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
            {
                let perms = words.next().unwrap_or("").to_string();
                let name = words.nth(3).unwrap_or("").to_string();
                out.push(Vma {
                    start,
                    end,
                    perms,
                    name,
                    flags: Vec::new(),
                    locked_kb: 0,
                });
                continue;
            }
        }
        let Some(vma) = out.last_mut() else { continue };
        if let Some(v) = line.strip_prefix("Locked:") {
            vma.locked_kb = v.trim().trim_end_matches("kB").trim().parse().unwrap();
        } else if let Some(v) = line.strip_prefix("VmFlags:") {
            vma.flags = v.split_whitespace().map(String::from).collect();
        }
    }
    out
}

/// The mapping holding `addr`.
pub fn vma_of(pid: &str, addr: usize) -> Option<Vma> {
    vmas(pid)
        .into_iter()
        .find(|v| (v.start..v.end).contains(&addr))
}

/// Where one of the needles was found.
#[derive(Debug)]
pub struct Hit {
    /// Index into the needles.
    pub needle: usize,
    pub addr: usize,
    pub vma: Vma,
}

const WINDOW: usize = 4096;

/// Every address of process `pid` holding one of `needles` (each 32 bytes). Memory is read
/// into a locked buffer, so scanning this process adds no copy outside locked memory.
pub fn find(pid: &str, needles: &[&[u8; 32]]) -> Vec<Hit> {
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut buf = SecretBytes::<WINDOW>::zero();
    let own = buf.expose().as_ptr() as usize;
    let own = own..own + WINDOW;
    let mut hits = Vec::new();
    for vma in vmas(pid) {
        if !vma.perms.starts_with('r') || vma.name.starts_with("[v") {
            continue;
        }
        let mut at = vma.start;
        while at + 32 <= vma.end {
            let len = WINDOW.min(vma.end - at);
            let b = &mut buf.expose_mut()[..len];
            if mem.read_exact_at(b, at as u64).is_err() {
                break;
            }
            for i in 0..=len - 32 {
                for (n, needle) in needles.iter().enumerate() {
                    // The buffer itself holds a copy of the window read before it.
                    if b[i] == needle[0] && b[i..i + 32] == needle[..] && !own.contains(&(at + i)) {
                        hits.push(Hit {
                            needle: n,
                            addr: at + i,
                            vma: vma.clone(),
                        });
                    }
                }
            }
            // Overlap by 31 bytes, so a needle across two windows is seen once.
            at += if len == WINDOW { WINDOW - 31 } else { len };
        }
    }
    hits
}
