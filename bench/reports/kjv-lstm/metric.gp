# written by mixprec; re-plot with: cd 'bench/reports/kjv-lstm' && gnuplot 'metric.gp'
set terminal pngcairo size 1000,620 noenhanced
set output 'metric.png'
set title 'validation perplexity'
set xlabel 'epoch'
set ylabel 'perplexity'
set grid
set datafile missing '?'
set key top right
plot 'metric.dat' index 0 using 1:2 with linespoints pt 7 ps 0.8 lw 2 title 'fp32', \
     'metric.dat' index 1 using 1:2 with linespoints pt 7 ps 0.8 lw 2 title 'bf16 O2'
