//! A parser for the Python literals of `.npy` headers.
//!
//! numpy writes `repr()` of a dict and reads it back with
//! `ast.literal_eval`; this reads the part of that language headers use:
//! dicts, tuples, lists, strings, integers, `True`, `False`, `None`. Its
//! input comes from files, so every malformed input is an error, and
//! nesting is bounded so that no input can exhaust the stack.

use std::fmt;

use crate::{Error, Result};

/// Nesting deeper than this is rejected.
const MAX_DEPTH: usize = 16;

/// Parses the whole of `text` as one literal.
pub(super) fn parse(text: &[u8]) -> Result<Lit> {
    let mut parser = Parser { s: text, pos: 0 };
    let lit = parser.value(0)?;
    if parser.peek().is_some() {
        return parser.fail("trailing characters");
    }
    Ok(lit)
}

/// A Python literal.
#[derive(Debug)]
pub(super) enum Lit {
    Str(String),
    Int(i128),
    Bool(bool),
    None,
    Seq(Vec<Lit>),
    Dict(Vec<(Lit, Lit)>),
}

impl fmt::Display for Lit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |items: Vec<String>| items.join(", ");
        match self {
            Lit::Str(s) => write!(f, "{s:?}"),
            Lit::Int(n) => write!(f, "{n}"),
            Lit::Bool(b) => write!(f, "{}", if *b { "True" } else { "False" }),
            Lit::None => write!(f, "None"),
            Lit::Seq(items) if items.len() == 1 => write!(f, "({},)", items[0]),
            Lit::Seq(items) => write!(
                f,
                "({})",
                join(items.iter().map(|x| x.to_string()).collect())
            ),
            Lit::Dict(pairs) => write!(
                f,
                "{{{}}}",
                join(pairs.iter().map(|(k, v)| format!("{k}: {v}")).collect())
            ),
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn fail<T>(&self, what: &str) -> Result<T> {
        Err(Error::format(format!(
            "malformed npy header: {what} at byte {} of the header text",
            self.pos
        )))
    }

    fn skip_ws(&mut self) {
        while self.pos < self.s.len() && self.s[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.pos).copied()
    }

    fn value(&mut self, depth: usize) -> Result<Lit> {
        if depth > MAX_DEPTH {
            return self.fail("nesting too deep");
        }
        match self.peek() {
            Some(b'{') => self.items(b'}', depth, true),
            Some(b'(') => self.items(b')', depth, false),
            Some(b'[') => self.items(b']', depth, false),
            Some(q @ (b'\'' | b'"')) => self.string(q),
            Some(b'-' | b'+' | b'0'..=b'9') => self.int(),
            Some(c) if c.is_ascii_alphabetic() => {
                let start = self.pos;
                while self.pos < self.s.len() && self.s[self.pos].is_ascii_alphanumeric() {
                    self.pos += 1;
                }
                match &self.s[start..self.pos] {
                    b"True" => Ok(Lit::Bool(true)),
                    b"False" => Ok(Lit::Bool(false)),
                    b"None" => Ok(Lit::None),
                    _ => {
                        self.pos = start;
                        self.fail("unknown name")
                    }
                }
            }
            Some(_) => self.fail("unexpected character"),
            None => self.fail("unexpected end"),
        }
    }

    /// A dict (`dict == true`), tuple or list, from its opening bracket.
    fn items(&mut self, close: u8, depth: usize, dict: bool) -> Result<Lit> {
        self.pos += 1;
        let mut seq = Vec::new();
        let mut pairs = Vec::new();
        loop {
            if self.peek() == Some(close) {
                self.pos += 1;
                break;
            }
            let first = self.value(depth + 1)?;
            if dict {
                if self.peek() != Some(b':') {
                    return self.fail("expected `:`");
                }
                self.pos += 1;
                pairs.push((first, self.value(depth + 1)?));
            } else {
                seq.push(first);
            }
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(c) if c == close => {}
                _ => return self.fail("expected `,` or a closing bracket"),
            }
        }
        Ok(if dict {
            Lit::Dict(pairs)
        } else {
            Lit::Seq(seq)
        })
    }

    fn string(&mut self, quote: u8) -> Result<Lit> {
        self.pos += 1;
        let mut out = Vec::new();
        while let Some(&c) = self.s.get(self.pos) {
            self.pos += 1;
            match c {
                c if c == quote => {
                    return match String::from_utf8(out) {
                        Ok(s) => Ok(Lit::Str(s)),
                        Err(_) => self.fail("string is not UTF-8"),
                    };
                }
                b'\\' => {
                    let escaped = self.s.get(self.pos).copied();
                    self.pos += 1;
                    match escaped {
                        Some(b'n') => out.push(b'\n'),
                        Some(b't') => out.push(b'\t'),
                        Some(b'r') => out.push(b'\r'),
                        Some(e) => out.push(e),
                        None => break,
                    }
                }
                c => out.push(c),
            }
        }
        self.fail("unterminated string")
    }

    fn int(&mut self) -> Result<Lit> {
        let negative = self.s[self.pos] == b'-';
        if matches!(self.s[self.pos], b'-' | b'+') {
            self.pos += 1;
        }
        let start = self.pos;
        let mut value: i128 = 0;
        while let Some(d @ b'0'..=b'9') = self.s.get(self.pos).copied() {
            value = match value
                .checked_mul(10)
                .and_then(|v| v.checked_add(i128::from(d - b'0')))
            {
                Some(v) => v,
                None => return self.fail("integer too large"),
            };
            self.pos += 1;
        }
        if self.pos == start {
            return self.fail("expected digits");
        }
        // Python 2 longs: `(3L,)`.
        if matches!(self.s.get(self.pos), Some(b'L' | b'l')) {
            self.pos += 1;
        }
        Ok(Lit::Int(if negative { -value } else { value }))
    }
}
