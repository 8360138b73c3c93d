"""The OptimizationJob's search (docs/optimization.md): the pure core a controller drives.

``search`` says which values each trial gets, what its TrainJob is and which trial is best;
``spaces`` holds the arithmetic of one search space; ``tpe`` the TPE search (optuna, imported
only when it proposes); ``plan`` one step of a running search (the trials to create, the status to
write); ``validation`` what admission adds to the CRD's rules. Nothing here does I/O.
"""
