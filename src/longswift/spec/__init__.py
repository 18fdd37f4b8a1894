"""TokenSwift: the speculative loop (draft -> tree -> verify -> accept -> commit), the adaptive choice
of step, the candidate trie, the n-gram table, the lossless walk and the draft heads."""
