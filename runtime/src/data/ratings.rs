//! Explicit-feedback ratings and the MovieLens (RecBole atomic `.inter`) loader.

use std::collections::HashMap;
use std::path::Path;

use super::{DataError, for_each_line, split_indices};

/// One observed rating of `item` by `user` (dense ids).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rating {
    /// Dense user id in `0..num_users`.
    pub user: u32,
    /// Dense item id in `0..num_items`.
    pub item: u32,
    /// The rating.
    pub value: f32,
}

/// A set of ratings over a dense user and item id space.
#[derive(Debug, Clone, PartialEq)]
pub struct Ratings {
    /// Size of the user id space.
    pub num_users: u32,
    /// Size of the item id space.
    pub num_items: u32,
    /// The ratings, in file (or split) order.
    pub entries: Vec<Rating>,
}

impl Ratings {
    /// Mean rating (0 if empty).
    pub fn mean(&self) -> f64 {
        if self.entries.is_empty() {
            return 0.0;
        }
        self.entries.iter().map(|r| f64::from(r.value)).sum::<f64>() / self.entries.len() as f64
    }

    /// Seeded (train, test) split; both keep the full id spaces. Entries come out shuffled.
    pub fn split(&self, test_fraction: f64, seed: u64) -> Result<(Ratings, Ratings), DataError> {
        let (train, test) = split_indices(self.entries.len(), test_fraction, seed)?;
        let pick = |indices: Vec<usize>| Ratings {
            num_users: self.num_users,
            num_items: self.num_items,
            entries: indices.into_iter().map(|i| self.entries[i]).collect(),
        };
        Ok((pick(train), pick(test)))
    }
}

/// Loads a RecBole atomic `.inter` file (MovieLens 100K's `ml-100k.inter`): a tab-separated header
/// of `name:type` fields that includes `user_id`, `item_id` and `rating`, then one rating per line.
/// User and item tokens are mapped to dense ids in order of first appearance.
pub fn load_movielens_inter(path: &Path) -> Result<Ratings, DataError> {
    let mut columns: Option<(usize, usize, usize, usize)> = None;
    let mut builder = RatingsBuilder::default();
    for_each_line(path, |line_number, line| {
        let Some((user_col, item_col, rating_col, width)) = columns else {
            let names: Vec<&str> = line
                .split('\t')
                .map(|field| field.split(':').next().unwrap_or(""))
                .collect();
            let find = |name: &str| names.iter().position(|n| *n == name);
            match (find("user_id"), find("item_id"), find("rating")) {
                (Some(u), Some(i), Some(r)) => columns = Some((u, i, r, names.len())),
                _ => {
                    return Err(DataError::parse(
                        path,
                        line_number,
                        "a RecBole header with user_id, item_id and rating fields (tab-separated name:type)",
                        line,
                    ));
                }
            }
            return Ok(());
        };
        if line.trim().is_empty() {
            return Ok(());
        }
        let fields: Vec<&str> = line.split('\t').collect();
        if fields.len() != width {
            return Err(DataError::parse(
                path,
                line_number,
                format!("{width} tab-separated fields"),
                line,
            ));
        }
        builder.add(
            (path, line_number, line),
            fields[user_col],
            fields[item_col],
            fields[rating_col],
        )
    })?;
    builder.finish(path)
}

/// Reads comma-separated ratings without a header: `user,item,rating` per line, with an
/// optional fourth column (a timestamp, ignored). Users and items are any non-empty tokens,
/// numbered densely in order of first appearance; blank lines are skipped. A malformed line is an
/// error naming the file, the line and what was expected.
pub fn load_ratings_csv(path: &Path) -> Result<Ratings, DataError> {
    let mut builder = RatingsBuilder::default();
    for_each_line(path, |line_number, line| {
        if line.trim().is_empty() {
            return Ok(());
        }
        let fields: Vec<&str> = line.split(',').collect();
        if !(3..=4).contains(&fields.len()) {
            return Err(DataError::parse(
                path,
                line_number,
                "user,item,rating[,timestamp]",
                line,
            ));
        }
        builder.add((path, line_number, line), fields[0], fields[1], fields[2])
    })?;
    builder.finish(path)
}

/// Ratings as they are read: users and items numbered densely in order of first appearance.
#[derive(Default)]
struct RatingsBuilder {
    users: HashMap<String, u32>,
    items: HashMap<String, u32>,
    entries: Vec<Rating>,
}

impl RatingsBuilder {
    /// Adds one rating read at `(path, line number, line)`.
    fn add(
        &mut self,
        (path, line_number, line): (&Path, usize, &str),
        user: &str,
        item: &str,
        rating: &str,
    ) -> Result<(), DataError> {
        let value: f32 = rating
            .trim()
            .parse()
            .ok()
            .filter(|v: &f32| v.is_finite())
            .ok_or_else(|| DataError::parse(path, line_number, "a finite rating", rating))?;
        let dense = |map: &mut HashMap<String, u32>, token: &str, what: &str| {
            let token = token.trim();
            if token.is_empty() {
                return Err(DataError::parse(
                    path,
                    line_number,
                    format!("a {what} token"),
                    line,
                ));
            }
            let next = map.len() as u32;
            Ok(*map.entry(token.to_string()).or_insert(next))
        };
        let user = dense(&mut self.users, user, "user_id")?;
        let item = dense(&mut self.items, item, "item_id")?;
        self.entries.push(Rating { user, item, value });
        Ok(())
    }

    /// The ratings read from `path`; an error if there are none.
    fn finish(self, path: &Path) -> Result<Ratings, DataError> {
        if self.entries.is_empty() {
            return Err(DataError::Empty {
                path: path.to_path_buf(),
                expected: "ratings".into(),
            });
        }
        Ok(Ratings {
            num_users: self.users.len() as u32,
            num_items: self.items.len() as u32,
            entries: self.entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error `load` gives for a file holding `content`.
    fn error_of(load: fn(&Path) -> Result<Ratings, DataError>, content: &str) -> String {
        let (_dir, path) = write(content);
        load(&path).unwrap_err().to_string()
    }

    fn write(content: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.inter");
        std::fs::write(&path, content).unwrap();
        (dir, path)
    }

    /// Two users and two items, numbered as they appear; the second rating is user 1's 4.5 for
    /// item 0.
    fn assert_second_of_two_users_and_items(ratings: &Ratings) {
        assert_eq!((ratings.num_users, ratings.num_items), (2, 2));
        assert_eq!(
            ratings.entries[1],
            Rating {
                user: 1,
                item: 0,
                value: 4.5
            }
        );
    }

    #[test]
    fn parses_header_and_maps_ids_densely() {
        let (_dir, path) = write(
            "user_id:token\titem_id:token\trating:float\ttimestamp:float\n196\t242\t3\t1\n7\t242\t4.5\t2\n196\t5\t1\t3\n",
        );
        let ratings = load_movielens_inter(&path).unwrap();
        assert_second_of_two_users_and_items(&ratings);
        assert!((ratings.mean() - 8.5 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn csv_ratings_parse_and_malformed_lines_are_named() {
        let (_dir, path) = write("196,242,3,881250949\n7,242,4.5\n\n196,5,1\n");
        let ratings = load_ratings_csv(&path).unwrap();
        assert_second_of_two_users_and_items(&ratings);
        assert_eq!(ratings.entries.len(), 3);
        let error = error_of(load_ratings_csv, "1,2,3\n1,2\n");
        assert!(
            error.contains("x.inter:2: expected user,item,rating[,timestamp]"),
            "{error}"
        );
        let error = error_of(load_ratings_csv, "1,2,NaN\n");
        assert!(error.contains(":1: expected a finite rating"), "{error}");
        let error = error_of(load_ratings_csv, ",2,3\n");
        assert!(error.contains(":1: expected a user_id token"), "{error}");
        let (_dir, path) = write("\n\n");
        assert_eq!(load_ratings_csv(&path).unwrap_err().category(), "empty");
    }

    #[test]
    fn malformed_lines_name_file_line_and_expectation() {
        let error = error_of(
            load_movielens_inter,
            "user_id:token\titem_id:token\trating:float\n1\t2\tabc\n",
        );
        assert!(
            error.contains("x.inter:2: expected a finite rating"),
            "{error}"
        );
        let error = error_of(
            load_movielens_inter,
            "user_id:token\titem_id:token\trating:float\n1\t2\n",
        );
        assert!(
            error.contains(":2: expected 3 tab-separated fields"),
            "{error}"
        );
        let error = error_of(load_movielens_inter, "u\ti\n");
        assert!(error.contains(":1: expected a RecBole header"), "{error}");
        let (_dir, path) = write("user_id:token\titem_id:token\trating:float\n");
        assert_eq!(load_movielens_inter(&path).unwrap_err().category(), "empty");
    }
}
