"""The passkey wing (needle in a haystack): the example format (`examples`, read by the needle evaluation
too), the examples mixed into language-model training and their key loss (`mix`), and the passkey stage
that follows training (`stage`). Training and the evaluation layer know none of them by name; the run's
wiring (`posab.run`) plugs them in. Import the submodules."""
