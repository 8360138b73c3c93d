"""The OptimizationJob's search (docs/optimization.md): the pure core a controller will drive.

``search`` says which values each trial gets, what its TrainJob is and which trial is best;
``spaces`` holds the arithmetic of one search space; ``validation`` what admission adds to the
CRD's rules. Nothing here does I/O.
"""
