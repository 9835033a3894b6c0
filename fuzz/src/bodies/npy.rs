//! One `.npy` member by hand: the body of `structured_npz`, and of the
//! main crate's npz test fixtures (`tests/io_common`), which include this
//! file.

/// An `.npy` v1.0 member: the header dict literal given, padded with
/// spaces and a newline to a multiple of 64 bytes, then `data`.
pub fn npy(dict: &str, data: &[u8]) -> Vec<u8> {
    let text_len = (10 + dict.len() + 1).div_ceil(64) * 64 - 10;
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(text_len as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.resize(10 + text_len - 1, b' ');
    out.push(b'\n');
    out.extend_from_slice(data);
    out
}
