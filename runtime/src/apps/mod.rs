//! Training applications (matrix factorization, logistic regression, LDA) on the parameter server.
