"""The model answers that later notebooks build on, one module per notebook (`tape_autograd`
for 01_tape_autograd), written by `make release` (autograder/earlier_answers.py): a module
holds its notebook's answers only once that notebook is past due, and until then refuses to
be imported, saying why."""
