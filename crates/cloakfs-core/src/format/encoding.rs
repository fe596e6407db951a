//! Text encodings used on disk: unpadded base64url (RFC 4648 section 5), strict on decode.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

/// Encodes bytes as unpadded base64url.
pub fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Decodes unpadded base64url; rejects padding, other alphabets and non-canonical trailing bits,
/// so every byte string has exactly one accepted encoding.
pub fn unb64(text: &[u8]) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD.decode(text).ok()
}

/// Decodes unpadded base64url into exactly `N` bytes.
pub fn unb64_array<const N: usize>(text: &str) -> Option<[u8; N]> {
    unb64(text.as_bytes())?.try_into().ok()
}
