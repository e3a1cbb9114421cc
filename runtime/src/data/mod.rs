//! Dataset loaders (MovieLens, digits, LDA-C, libsvm/CSV) and seeded synthetic generators.
