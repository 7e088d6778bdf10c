"""Training rows for drafter trainers, built from committed completions."""
