//! Bag-of-words corpora: the LDA-C format (`N id:count id:count …`) and vocabulary files.

use std::path::Path;

use super::{DataError, for_each_line};

/// Documents as `(word id, count)` lists over a vocabulary of `vocab_size` words.
#[derive(Debug, Clone, PartialEq)]
pub struct Corpus {
    /// Size of the vocabulary (word ids are `0..vocab_size`).
    pub vocab_size: usize,
    /// One `(word, count)` list per document, in file order.
    pub docs: Vec<Vec<(u32, u32)>>,
}

impl Corpus {
    /// Total number of tokens (sum of counts).
    pub fn num_tokens(&self) -> u64 {
        self.docs
            .iter()
            .flatten()
            .map(|&(_, count)| u64::from(count))
            .sum()
    }

    /// Tokens of every document expanded in order (doc-major, then file order of words), the
    /// order in which the `lda` Python package visits them: `(doc, word)` per token.
    pub fn tokens(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.docs.iter().enumerate().flat_map(|(doc, words)| {
            words.iter().flat_map(move |&(word, count)| {
                std::iter::repeat_n((doc as u32, word), count as usize)
            })
        })
    }
}

/// Loads an LDA-C file with 0-based word ids (as `lda.utils.ldac2dtm(offset=0)`): each non-empty
/// line is `N id:count …` with exactly `N` pairs. The vocabulary size is the largest id plus one.
pub fn load_ldac(path: &Path) -> Result<Corpus, DataError> {
    let mut docs = Vec::new();
    let mut max_word: Option<u32> = None;
    for_each_line(path, |line_number, line| {
        let mut parts = line.split_whitespace();
        let Some(first) = parts.next() else {
            return Ok(());
        };
        let unique: usize = first
            .parse()
            .map_err(|_| DataError::parse(path, line_number, "a count of unique terms", first))?;
        let mut words = Vec::with_capacity(unique);
        for pair in parts {
            let parsed = pair.split_once(':').and_then(|(id, count)| {
                Some((id.parse::<u32>().ok()?, count.parse::<u32>().ok()?))
            });
            let Some((word, count)) = parsed.filter(|&(_, count)| count > 0) else {
                return Err(DataError::parse(
                    path,
                    line_number,
                    "a term id:count pair with a positive count",
                    pair,
                ));
            };
            max_word = max_word.max(Some(word));
            words.push((word, count));
        }
        if words.len() != unique {
            return Err(DataError::parse(
                path,
                line_number,
                format!("{unique} id:count pairs as announced"),
                &format!("{} pairs", words.len()),
            ));
        }
        docs.push(words);
        Ok(())
    })?;
    let Some(max_word) = max_word else {
        return Err(DataError::Empty {
            path: path.to_path_buf(),
            expected: "LDA-C documents".into(),
        });
    };
    Ok(Corpus {
        vocab_size: max_word as usize + 1,
        docs,
    })
}

/// Loads a vocabulary file: one word per line, the line's position is the word id.
pub fn load_vocab(path: &Path) -> Result<Vec<String>, DataError> {
    let mut words = Vec::new();
    for_each_line(path, |line_number, line| {
        let word = line.trim();
        if word.is_empty() || word.contains(char::is_whitespace) {
            return Err(DataError::parse(
                path,
                line_number,
                "one word per line",
                line,
            ));
        }
        words.push(word.to_string());
        Ok(())
    })?;
    if words.is_empty() {
        return Err(DataError::Empty {
            path: path.to_path_buf(),
            expected: "vocabulary words".into(),
        });
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_documents_and_expands_tokens_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.ldac");
        std::fs::write(&path, "2 0:2 3:1\n\n1 1:1\n").unwrap();
        let corpus = load_ldac(&path).unwrap();
        assert_eq!(corpus.vocab_size, 4);
        assert_eq!(corpus.num_tokens(), 4);
        let tokens: Vec<_> = corpus.tokens().collect();
        assert_eq!(tokens, vec![(0, 0), (0, 0), (0, 3), (1, 1)]);
    }

    #[test]
    fn malformed_lines_are_errors_with_line_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.ldac");
        for (content, expected) in [
            ("1 0:1\n2 0:1\n", "c.ldac:2: expected 2 id:count pairs"),
            ("x 0:1\n", "c.ldac:1: expected a count of unique terms"),
            ("1 0-1\n", "c.ldac:1: expected a term id:count pair"),
            ("1 0:0\n", "c.ldac:1: expected a term id:count pair"),
        ] {
            std::fs::write(&path, content).unwrap();
            let error = load_ldac(&path).unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
        }
        std::fs::write(&path, "\n").unwrap();
        assert_eq!(load_ldac(&path).unwrap_err().category(), "empty");
        std::fs::write(&path, "a\nb c\n").unwrap();
        let error = load_vocab(&path).unwrap_err().to_string();
        assert!(
            error.contains("c.ldac:2: expected one word per line"),
            "{error}"
        );
    }
}
