# written by mixprec; re-plot with: cd 'bench/reports/lstm-sweep' && gnuplot 'tflops.gp'
set terminal pngcairo size 1000,620 noenhanced
set output 'tflops.png'
set title 'achieved TFLOP/s vs cells'
set xlabel 'cells (hidden size)'
set ylabel 'TFLOP/s'
set grid
set datafile missing '?'
set key top right
plot 'tflops.dat' index 0 using 1:2 with linespoints pt 7 ps 0.8 lw 2 title 'bf16, 2 layers, batch 64', \
     'tflops.dat' index 1 using 1:2 with linespoints pt 7 ps 0.8 lw 2 title 'fp32, 2 layers, batch 64'
